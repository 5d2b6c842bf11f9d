"""A PySpark driver of its own for a store that needs its own JVM (``harness.s3a``'s ``s3a-3.3``:
hadoop-aws 3.3 cannot share a class path with 3.5). It writes and reads a small table at the
location, then checks the connector's exclusive create there, and prints one JSON line:

    python s3a_store_job.py --conf JSON --location URI

``conf`` is the Spark settings (``harness.s3a.spark_conf``); the output names the S3A jar the JVM
loaded, the rows read back, ``Storage.atomic_exclusive``, and how a second exclusive create of one
name ended (``FileExistsError`` is the contract) with the bytes left stored.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from pyspark.sql import SparkSession

from snapcoord.spark_connector.storage import open_location
from snapcoord.spark_connector.storage.hadoop import HadoopStorage


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--conf", required=True)
    p.add_argument("--location", required=True)
    args = p.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
    for key, value in json.loads(args.conf).items():
        builder = builder.config(key, value)
    spark = builder.config("spark.driver.bindAddress", "127.0.0.1").getOrCreate()
    try:
        table = f"{args.location}/table"
        spark.range(7).write.mode("overwrite").json(table)
        rows = sorted(r["id"] for r in spark.read.json(table).collect())
        storage = open_location(f"{args.location}/log", spark=spark)
        assert isinstance(storage, HadoopStorage)
        storage.write_bytes("0", b"first", exclusive=True)
        try:
            storage.write_bytes("0", b"second", exclusive=True)
            second = "written"
        except FileExistsError:
            second = "FileExistsError"
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        source = jvm.org.apache.hadoop.fs.s3a.S3AFileSystem._java_lang_class.getProtectionDomain()
        print(
            json.dumps(
                {
                    "jar": str(source.getCodeSource().getLocation().getPath()).rpartition("/")[2],
                    "fs_class": storage.fs_class,
                    "rows": rows,
                    "atomic_exclusive": storage.atomic_exclusive,
                    "second": second,
                    "stored": storage.read_bytes("0").decode(),
                }
            ),
            flush=True,
        )
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
