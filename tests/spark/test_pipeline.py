"""examples/pipeline.py end to end: batch produce -> streaming aggregate to Parquet with a
checkpoint -> restart -> exact totals."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import pipeline  # noqa: E402


def test_pipeline_totals_are_exact(spark, spark_broker, write_opts, tmp_path):
    result = pipeline.main(spark_broker, str(tmp_path), first_batch=6000, second_batch=2500,
                           spark=spark, writer_options=write_opts)
    assert result["got"] == result["want"]
    # maxOffsetsPerTrigger=4000: 6000 events take 2 micro-batches, the restart reads only 2500
    assert result["batches"] == (2, 1)
    assert sum(c for c, _ in result["got"].values()) == 8500
