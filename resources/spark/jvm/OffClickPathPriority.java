package photon.spark;

import org.apache.spark.TaskContext;
import org.apache.spark.TaskFailedReason;
import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.SparkPlugin;

/**
 * Runs the tasks of the work kept off the click path at the JVM's lowest thread priority (see
 * resources/spark/task_priority.py). A run off the click path tags its Spark operations with {@link #TAG};
 * Spark hands a job's tags to its tasks as the local property {@code spark.job.tags}, each tag
 * prefixed by the session (Spark classic) or by the Connect operation. The priority is set in the
 * task's own thread before the task runs and set back when it ends: the executor's threads are
 * pooled, and the next task on the thread may be a click run's. With
 * {@code -XX:ThreadPriorityPolicy=1} the JVM maps a thread's priority to its Linux nice value;
 * without it this changes nothing.
 */
public final class OffClickPathPriority implements SparkPlugin {
    public static final String TAG = "photon-off-click-path";

    @Override
    public DriverPlugin driverPlugin() {
        return null;
    }

    @Override
    public ExecutorPlugin executorPlugin() {
        return new Tasks();
    }

    static boolean offClickPath(String tags) {
        for (String tag : tags.split(",")) {
            if (tag.endsWith(TAG)) {
                return true;
            }
        }
        return false;
    }

    static final class Tasks implements ExecutorPlugin {
        @Override
        public void onTaskStart() {
            TaskContext task = TaskContext.get();
            String tags = task == null ? null : task.getLocalProperty("spark.job.tags");
            if (tags != null && offClickPath(tags)) {
                Thread.currentThread().setPriority(Thread.MIN_PRIORITY);
            }
        }

        @Override
        public void onTaskSucceeded() {
            restore();
        }

        @Override
        public void onTaskFailed(TaskFailedReason reason) {
            restore();
        }

        private static void restore() {
            Thread thread = Thread.currentThread();
            if (thread.getPriority() != Thread.NORM_PRIORITY) {
                thread.setPriority(Thread.NORM_PRIORITY);
            }
        }
    }
}
