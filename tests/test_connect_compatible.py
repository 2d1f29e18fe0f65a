"""The pipeline's code runs on a Spark Connect session as it does in process: it makes no call a
Connect client lacks (`sparkContext`, RDDs, py4j handles) and does not use the `DeltaTable` Python
API, which has no Connect backend for delta-spark 4.0 (docs/STACK.md)."""

import ast

from resources.state.layout import REPO_ROOT

PACKAGES = ("resources", "spark_ops", "photon_assets", "sensors", "photon")
CLASSIC_ONLY_ATTRIBUTES = {"sparkContext", "rdd", "_jvm", "_jsc", "_jdf", "_jsparkSession", "_sc"}
# The local-mode branch of SparkResource.jobs_counted: a job count where a status tracker exists.
ALLOWED = {("resources/spark/session.py", "sparkContext")}


def classic_only_uses() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).glob("*.py")):
            relative = str(path.relative_to(REPO_ROOT))
            for node in ast.walk(ast.parse(path.read_text(), relative)):
                if isinstance(node, ast.Attribute) and node.attr in CLASSIC_ONLY_ATTRIBUTES:
                    if (relative, node.attr) not in ALLOWED:
                        found.append(f"{relative}:{node.lineno} .{node.attr}")
                elif isinstance(node, ast.ImportFrom) and node.module == "delta.tables":
                    found.append(f"{relative}:{node.lineno} from delta.tables import ...")
    return found


def test_the_pipeline_makes_no_call_a_spark_connect_client_lacks():
    assert classic_only_uses() == []
