import contextlib
import io
import re

from pyspark.sql import functions as F

from spark_ops.schemas import with_run_values


def generated_code(df) -> list[str]:
    """The Java code Spark generates for the frame's stages (explain's codegen mode), without the
    plans printed beside it (their expression ids differ from frame to frame)."""
    # Adaptive execution plans its stages when they run: explain shows no code before that.
    adaptive = df.sparkSession.conf.get("spark.sql.adaptive.enabled")
    df.sparkSession.conf.set("spark.sql.adaptive.enabled", "false")
    try:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            df.explain(mode="codegen")
    finally:
        df.sparkSession.conf.set("spark.sql.adaptive.enabled", adaptive)
    sections = re.split(r"^== Subtree .*$", out.getvalue(), flags=re.M)[1:]
    code = [section.split("Generated code:", 1)[1] for section in sections if "Generated code:" in section]
    assert code, out.getvalue()[:2000]
    return code


def test_run_values_are_columns_of_every_row(spark):
    rows = with_run_values(spark.range(3), bound_us=1_795_851_462_490_769, none_yet=None).collect()
    assert [(r.id, r.bound_us, r.none_yet) for r in rows] == [(i, 1_795_851_462_490_769, None) for i in range(3)]


def test_a_run_value_leaves_the_generated_code_as_it_was(spark):
    events = spark.range(100).withColumn("timestamp_us", F.col("id") * 1_000)
    clocks = (1_795_851_462_490_769, 1_795_851_469_000_001)

    def by_value(clock: int):
        return (with_run_values(events, clock_us=clock).where(F.col("timestamp_us") < F.col("clock_us"))
                .select("id", F.timestamp_micros(F.col("clock_us")).alias("seen_at")))

    def by_literal(clock: int):
        return events.where(F.col("timestamp_us") < F.lit(clock)).select("id", F.timestamp_micros(F.lit(clock)).alias("seen_at"))

    # What run values avoid: a literal is written into the code, which Spark compiles anew per value.
    assert generated_code(by_literal(clocks[0])) != generated_code(by_literal(clocks[1]))
    assert generated_code(by_value(clocks[0])) == generated_code(by_value(clocks[1]))
    assert not any(str(clocks[0]) in code for code in generated_code(by_value(clocks[0])))
    assert by_value(clocks[0]).count() == 100
