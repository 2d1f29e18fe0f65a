import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.Collections;
import java.util.Random;

import io.delta.storage.LogStore;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;

/**
 * One of two racing writers of tests/resources/spark/test_log_store.py: writes versions 0 to N-1 of a Delta
 * log through the given LogStore class, each as one line naming this writer, and prints each version it
 * won (its write returned without FileAlreadyExistsException). Every version is raced for: the writers
 * go for it together, each once both are done with the version before (a marker file per writer and
 * version in BARRIER_DIR), after a random wait within 0.2 ms so that neither keeps an edge.
 * Usage: CommitRace LOG_STORE_CLASS LOG_DIR BARRIER_DIR VERSIONS WRITER OTHER_WRITER
 */
public class CommitRace {
    public static void main(String[] args) throws Exception {
        Configuration conf = new Configuration();
        LogStore store = (LogStore) Class.forName(args[0]).getConstructor(Configuration.class).newInstance(conf);
        String barrier = args[2], writer = args[4], other = args[5];
        Random random = new Random();
        StringBuilder won = new StringBuilder();
        for (int version = 0; version < Integer.parseInt(args[3]); version++) {
            long go = System.nanoTime() + random.nextInt(200_000);
            while (System.nanoTime() < go) {
                Thread.onSpinWait();
            }
            Path path = new Path("file://" + args[1] + String.format("/%020d.json", version));
            try {
                store.write(path, Collections.singletonList(writer).iterator(), false, conf);
                won.append(version).append('\n');
            } catch (FileAlreadyExistsException lost) {
                // the other writer made this version first
            }
            Files.createFile(Paths.get(barrier, writer + "-" + version));
            while (!Files.exists(Paths.get(barrier, other + "-" + version))) {
                Thread.onSpinWait();
            }
        }
        System.out.print(won);
    }
}
