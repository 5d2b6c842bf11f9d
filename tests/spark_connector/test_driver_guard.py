"""The connector's driver-only guards, checked on a real local Spark."""

from __future__ import annotations

import pickle

import pytest
from pyspark.sql import SparkSession

from snapcoord.spark_connector import DriverOnly, ExecutorContextError, require_driver


class _Holder(DriverOnly):
    def __init__(self) -> None:
        self.target = "127.0.0.1:50051"


pytestmark = pytest.mark.spark


def test_require_driver_passes_on_the_driver(spark: SparkSession) -> None:
    require_driver("test")  # must not raise in the driver process


def test_require_driver_fails_inside_a_task(spark: SparkSession) -> None:
    def probe(_: object) -> str:
        try:
            require_driver("CoordinatorClient.register")
        except ExecutorContextError as e:
            return str(e)
        return "no error"

    results = spark.sparkContext.parallelize([1, 2], 2).map(probe).collect()
    assert len(results) == 2
    for message in results:
        assert "CoordinatorClient.register must run on the Spark driver" in message


def test_driver_only_object_cannot_be_shipped_to_executors(spark: SparkSession) -> None:
    holder = _Holder()
    with pytest.raises(Exception, match="cannot be pickled into a Spark task"):
        spark.sparkContext.parallelize([1], 1).map(lambda x: (x, holder.target)).collect()


def test_driver_only_object_refuses_plain_pickle() -> None:
    with pytest.raises(ExecutorContextError, match="_Holder holds a coordinator connection"):
        pickle.dumps(_Holder())
