package photon.delta;

import java.io.BufferedWriter;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.StandardOpenOption;
import java.util.Iterator;
import java.util.UUID;

import io.delta.storage.LocalLogStore;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;

/**
 * Delta's log store for local file systems, safe across processes.
 *
 * <p>Delta's own LocalLogStore makes a commit file appear only if it is absent by checking that it is
 * absent and then renaming a temporary file onto it, inside a Java lock: two JVMs committing the same
 * version at once can both pass the check, and the second rename replaces the first commit. Here the
 * temporary file is hard-linked to the commit file's name instead: link(2) fails when the name exists,
 * in one step of the file system, so exactly one writer of a version wins, whichever process it runs in,
 * and the other gets the FileAlreadyExistsException Delta expects of a lost race (it then checks the
 * winner's commit for conflicts and retries at the next version). Overwrites (Delta's
 * `_last_checkpoint`) are left to LocalLogStore.
 */
public class LinkLogStore extends LocalLogStore {

    public LinkLogStore(Configuration hadoopConf) {
        super(hadoopConf);
    }

    @Override
    public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
            throws IOException {
        if (overwrite) {
            super.write(path, actions, true, hadoopConf);
            return;
        }
        java.nio.file.Path target = new java.io.File(path.toUri().getPath()).toPath();
        // Named like Delta's own temporary files (a leading dot, `.tmp`): readers of the log skip them.
        java.nio.file.Path temp = target.resolveSibling("." + target.getFileName() + "." + UUID.randomUUID() + ".tmp");
        try {
            try (BufferedWriter out = Files.newBufferedWriter(temp, StandardCharsets.UTF_8, StandardOpenOption.CREATE_NEW,
                    StandardOpenOption.WRITE)) {
                while (actions.hasNext()) {
                    out.write(actions.next());
                    out.write('\n');
                }
            }
            Files.createLink(target, temp);  // java.nio.file.FileAlreadyExistsException if another writer won
        } catch (NoSuchFileException e) {
            throw new FileNotFoundException(e.getMessage());
        } finally {
            Files.deleteIfExists(temp);
        }
    }

    @Override
    public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
        return false;  // a commit file appears whole, by its link
    }
}
