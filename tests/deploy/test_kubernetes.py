"""deploy/kubernetes: every overlay renders and validates strictly, a broken manifest fails, and
every value that must agree with the server (ports, paths, timings, metric names, settings) does."""

import copy
import subprocess
from dataclasses import fields

import jsonschema
import kubernetes_validate
import pytest
import yaml
from manifests import KUBERNETES, OVERLAYS, ROOT, UnknownKind, get_routes, one, rendered, require_tool, validate

from aieng.observability import metrics
from aieng.settings import Settings, _coerce, env_name

SETTINGS_ENV = {env_name(f.name): f.name for f in fields(Settings)}


def container(docs, name="aieng"):
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] + pod.get("initContainers", []) if c["name"] == name)


def env_of(c) -> dict:
    return {e["name"]: e.get("value") for e in c.get("env", [])}


def setting(c, name: str):
    """The value the server will run with: the manifest's variable, else Settings' default."""
    raw = env_of(c).get(env_name(name))
    return _coerce(name, raw) if raw is not None else getattr(Settings(), name)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_of_every_overlay_validates_strictly(overlay):
    docs = rendered(overlay)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy", "ServiceMonitor", "Secret"} <= kinds
    assert ("ScaledObject" in kinds) == (overlay == "cpu-keda")
    assert ("HorizontalPodAutoscaler" in kinds) != (overlay == "cpu-keda")  # KEDA owns its own HPA
    for doc in docs:
        validate(doc)


def test_a_broken_probe_an_unknown_field_and_an_unknown_kind_fail():
    docs = rendered("cpu")
    deployment = copy.deepcopy(one(docs, "Deployment"))
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]
    probe["prot"] = probe.pop("port")  # a typo kubectl apply would drop
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)
    deployment = copy.deepcopy(one(docs, "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["periodSeconds"] = "ten"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)
    scaled = copy.deepcopy(one(rendered("cpu-keda"), "ScaledObject"))
    scaled["spec"]["triggers"][0]["metadata"]["threshold"] = 5  # KEDA's metadata values are strings
    with pytest.raises(jsonschema.ValidationError):
        validate(scaled)
    scaled = copy.deepcopy(one(rendered("cpu-keda"), "ScaledObject"))
    scaled["spec"]["maxReplicas"] = 8  # the HPA's name, not KEDA's (maxReplicaCount)
    with pytest.raises(jsonschema.ValidationError):
        validate(scaled)
    with pytest.raises(UnknownKind):
        validate({"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObjekt", "metadata": {"name": "x"}, "spec": {}})


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_environment_names_and_values_are_settings_the_server_accepts(overlay):
    pod = one(rendered(overlay), "Deployment")["spec"]["template"]["spec"]
    for c in pod["containers"] + pod["initContainers"]:
        for name, value in env_of(c).items():
            assert name in SETTINGS_ENV, f"{c['name']}: {name} is not a setting (aieng serve --help lists them)"
            if value is not None:
                _coerce(SETTINGS_ENV[name], value)  # raises ConfigError as the server would at start-up


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ports_probe_paths_and_scrape_target_agree_with_the_server(overlay):
    docs = rendered(overlay)
    c = container(docs)
    deployment, service = one(docs, "Deployment"), one(docs, "Service")
    port = setting(c, "port")
    assert setting(c, "host") == "0.0.0.0"  # the default (loopback) would be unreachable from the Service
    assert c["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    routes = get_routes()
    assert c["readinessProbe"]["httpGet"]["path"] == "/health/ready"  # turns 503 while starting and draining
    for probe in ("startupProbe", "livenessProbe"):  # never depends on the model
        assert c[probe]["httpGet"] == {"path": "/health/live", "port": "http"}
    assert {"/health/ready", "/health/live", "/metrics"} <= routes
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert (annotations["prometheus.io/port"], annotations["prometheus.io/path"]) == (str(port), "/metrics")
    endpoint = one(docs, "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"] and endpoint["path"] in routes
    network = one(docs, "NetworkPolicy")["spec"]
    assert network["ingress"] == [{"ports": [{"port": "http", "protocol": "TCP"}]}]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_grace_period_covers_prestop_drain_delay_and_graceful_timeout(overlay):
    docs = rendered(overlay)
    c, pod = container(docs), one(docs, "Deployment")["spec"]["template"]["spec"]
    pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    needed = float(pre_stop[1]) + setting(c, "drain_delay_s") + setting(c, "graceful_timeout_s")
    assert pod["terminationGracePeriodSeconds"] >= needed
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120  # a cold verify + load, with margin
    assert setting(c, "compile_budget_s") <= startup["periodSeconds"] * startup["failureThreshold"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_selectors_select_the_pods_and_the_rollout_never_drops_below_the_replica_count(overlay):
    docs = rendered(overlay)
    deployment = one(docs, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    selected = [
        one(docs, "Service")["spec"]["selector"],
        one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
        one(docs, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"],
    ]
    for selector in selected:
        assert selector.items() <= labels.items()
    assert (
        one(docs, "ServiceMonitor")["spec"]["selector"]["matchLabels"].items()
        <= one(docs, "Service")["metadata"]["labels"].items()
    )
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = deployment["spec"]["template"]["spec"]
    for c in pod["containers"] + pod["initContainers"]:
        assert c["securityContext"]["readOnlyRootFilesystem"] and not c["securityContext"]["allowPrivilegeEscalation"]
        assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"])  # prometheus' multiprocess files, locks
    serving = container(docs)
    store_mount = next(m for m in serving["volumeMounts"] if m["name"] == "store")
    assert store_mount.get("readOnly") is True  # the server only reads the store; promotes happen elsewhere
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0


def test_the_admin_token_comes_from_the_secret_kustomize_generated():
    docs = rendered("cpu")
    ref = next(e for e in container(docs)["env"] if e["name"] == "AIENG_ADMIN_TOKEN")["valueFrom"]["secretKeyRef"]
    secret = one(docs, "Secret", ref["name"])  # the generated name, content hash included
    assert ref["key"] in secret["data"]


def test_the_autoscalers_read_a_metric_the_server_exports_for_the_right_target():
    waiting = metrics.REQUESTS_WAITING._name
    hpa = one(rendered("cpu"), "HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "aieng"}
    assert hpa["metrics"][0]["pods"]["metric"]["name"] == waiting
    rules = yaml.safe_load((KUBERNETES / "prometheus-adapter" / "rules.yaml").read_text())["rules"]
    assert rules[0]["name"]["as"] == waiting and waiting in rules[0]["seriesQuery"]
    docs = rendered("cpu-keda")
    scaled = one(docs, "ScaledObject")["spec"]
    assert scaled["scaleTargetRef"]["name"] == one(docs, "Deployment")["metadata"]["name"]
    namespace = one(docs, "Deployment")["metadata"]["namespace"]
    assert f'{waiting}{{namespace="{namespace}"}}' in scaled["triggers"][0]["metadata"]["query"]


def adapter_query(namespace: str) -> str:
    """prometheus-adapter's metricsQuery as the adapter fills it in for the HPA's request."""
    rule = yaml.safe_load((KUBERNETES / "prometheus-adapter" / "rules.yaml").read_text())["rules"][0]
    return (
        rule["metricsQuery"]
        .replace("<<.Series>>", rule["name"]["as"])
        .replace("<<.LabelMatchers>>", f'namespace="{namespace}",pod=~"aieng-a|aieng-b"')
        .replace("<<.GroupBy>>", "pod")
    )


def test_the_autoscaling_queries_on_synthetic_series(tmp_path):
    """Two pods over three minutes: pod a's queue grows 0 -> 12 and is scraped twice (a
    ServiceMonitor and the annotations); pod b's stays at 2. Another namespace must not count."""
    promtool = require_tool("promtool")
    query = one(rendered("cpu-keda"), "ScaledObject")["spec"]["triggers"][0]["metadata"]["query"]
    series = [
        {"series": 'aieng_requests_waiting{namespace="aieng",pod="aieng-a",job="servicemonitor"}', "values": "0+1x12"},
        {"series": 'aieng_requests_waiting{namespace="aieng",pod="aieng-a",job="kubernetes-pods"}', "values": "0+1x12"},
        {"series": 'aieng_requests_waiting{namespace="aieng",pod="aieng-b",job="servicemonitor"}', "values": "2x12"},
        {"series": 'aieng_requests_waiting{namespace="other",pod="aieng-c",job="servicemonitor"}', "values": "50x12"},
    ]
    # At 3m the 1-minute window holds samples at 2m, 2m15s, ..., 3m: pod a's 8..12, mean 10.
    tests = {
        "rule_files": [],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": adapter_query("aieng"),
                        "eval_time": "3m",
                        "exp_samples": [
                            {"labels": '{pod="aieng-a"}', "value": 10},
                            {"labels": '{pod="aieng-b"}', "value": 2},
                        ],
                    },
                    {"expr": query, "eval_time": "3m", "exp_samples": [{"labels": "{}", "value": 12}]},
                ],
            }
        ],
    }
    path = tmp_path / "autoscaling_test.yml"
    path.write_text(yaml.safe_dump(tests))
    out = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    # and the check can fail: a query that sums duplicates would give pod a 20, not 10
    tests["tests"][0]["promql_expr_test"][0]["expr"] = adapter_query("aieng").replace("max by", "sum by")
    path.write_text(yaml.safe_dump(tests))
    assert subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, timeout=60).returncode != 0


def test_the_readme_walks_through_deploy_scale_rollback_and_says_what_was_validated():
    readme = (KUBERNETES / "README.md").read_text()
    for topic in ("kubectl apply -k", "rollout undo", "aieng model promote", "Validated here", "needs a real cluster"):
        assert topic in readme, topic
    for overlay in OVERLAYS:
        assert f"overlays/{overlay}" in readme
    assert (ROOT / "deploy" / "README.md").read_text().count("kubernetes/") >= 1
