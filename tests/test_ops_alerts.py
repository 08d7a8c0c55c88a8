"""The alert rules of deploy/prometheus: promtool's check and the rules' unit tests, and the wiring
into the compose stack's Prometheus. promtool comes from Debian's prometheus package
(scripts/setup.d/30-ops.sh); without it the test skips, and fails under CI=true."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

PROM = Path(__file__).resolve().parent.parent / "deploy" / "prometheus"


def _promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is missing (scripts/setup.d/30-ops.sh installs it)")
        pytest.skip("promtool is not installed")
    return tool


def test_rules_check_and_unit_tests_pass():
    tool = _promtool()
    check = subprocess.run([tool, "check", "rules", "alerts.yml"], cwd=PROM, capture_output=True, text=True,
                           timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run([tool, "test", "rules", "alerts_test.yml"], cwd=PROM, capture_output=True, text=True,
                          timeout=120)
    assert unit.returncode == 0, unit.stdout + unit.stderr


def test_every_rule_has_a_unit_test_and_the_stack_loads_the_rules():
    rules = yaml.safe_load((PROM / "alerts.yml").read_text())
    names = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert {"SapgridTargetDown", "SapgridFrameLatencyHigh", "SapgridFramesRejected", "SapgridCallsRefused",
            "SapgridQueueDepthHigh", "SapgridSubscribersLost"} <= names
    tests = yaml.safe_load((PROM / "alerts_test.yml").read_text())
    tested = {t["alertname"] for case in tests["tests"] for t in case["alert_rule_test"] if t.get("exp_alerts")}
    assert names == tested, f"rules without a firing unit test: {sorted(names - tested)}"
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    assert "/etc/prometheus/alerts.yml" in config["rule_files"]
    compose = yaml.safe_load((PROM.parent / "compose.yaml").read_text())
    mounts = compose["services"]["prometheus"]["volumes"]
    assert "./prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro" in mounts


def test_promtool_check_config_accepts_the_stack_config(tmp_path):
    tool = _promtool()
    # the config names the rules at their path in the container: check a copy pointing at the repo's file
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    config["rule_files"] = [str(PROM / "alerts.yml")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    out = subprocess.run([tool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
