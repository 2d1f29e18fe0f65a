"""What the sensors use besides their context, made once per process (sensors/deps.py)."""

import dagster as dg
from dagster._core.test_utils import create_run_for_test

from sensors.deps import sensor_instance


def tick_context(ref, cursor=None) -> dg.SensorEvaluationContext:
    """A tick's context as the daemon's code server makes it: from the instance's reference."""
    return dg.SensorEvaluationContext(instance_ref=ref, last_tick_completion_time=None, last_run_key=None,
                                      cursor=cursor, log_key=None, repository_name=None)


def test_ticks_share_one_instance_per_reference():
    with dg.instance_for_test() as instance, dg.instance_for_test() as other:
        seen = []
        for _ in range(3):
            with tick_context(instance.get_ref()) as context:
                seen.append(sensor_instance(context))
        assert seen[0] is seen[1] is seen[2]
        assert seen[0].root_directory == instance.root_directory
        run = create_run_for_test(instance, job_name="join_clicks_job")
        assert seen[0].get_run_by_id(run.run_id) is not None  # a run created since is seen
        with tick_context(other.get_ref()) as context:
            assert sensor_instance(context).root_directory == other.root_directory
        with dg.build_sensor_context(instance=instance) as context:
            assert sensor_instance(context) is instance
