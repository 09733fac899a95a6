#!/usr/bin/env python3
"""Structural checks of rendered tessera manifests, beyond what a schema says.

Usage: check.py RENDERED.yaml OUT_DIR

RENDERED.yaml is the output of `kubectl kustomize` for the base or an overlay.
Each check prints one line per object it looked at ("ok ..." or "FAIL ..."):

- every StatefulSet has a headless Service named by its serviceName, selecting
  its pods;
- every Service selects the pods of some workload;
- every container of a long-running workload (Deployment, DaemonSet,
  StatefulSet) has a readiness and a liveness probe on one of its ports; a
  tessera daemon's are GET /readyz and /healthz on the port of `[telemetry]
  listen` in the config file it is started with, which must be 0.0.0.0:<port>;
- every `--config FILE` a container is started with is a key of a ConfigMap
  mounted at FILE's directory;
- every container, the Job's included, has memory requests and limits, the
  request no larger than the limit;
- a pod's prometheus.io/port annotation is one of its container ports (its
  telemetry port for a tessera daemon);
- every PodDisruptionBudget selects the pods of a workload;
- every ServiceAccount, ConfigMap and ClusterRole named is rendered too;
- the placement Job writes where the daemons read (its ETCD_ENDPOINTS and
  TESSERA_ENVIRONMENT are every daemon's etcd endpoints and env), names the
  pods the StatefulSets run (AGGREGATORS and INGESTERS are their replicas, a
  multiple of REPLICATION_FACTOR for the aggregators) at the addresses they
  listen and advertise on.

Every ConfigMap key ending in .toml or .sh is written to OUT_DIR/<key>, and the
Job's literal environment to OUT_DIR/placement-init.env (NAME=VALUE lines), for
test.sh to give each daemon's config to its `--check-config` and to run the
Job's script. Exits 1 when any check fails.
"""

import os
import re
import sys
import tomllib

import yaml

WORKLOAD_KINDS = ("Deployment", "DaemonSet", "StatefulSet", "Job")
LONG_RUNNING_KINDS = ("Deployment", "DaemonSet", "StatefulSet")
DAEMONS = ("collector", "aggregator", "ingester")
QUANTITY_UNITS = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "m": 10**-3, "": 1,
}

failures = []


def report(ok, subject, detail):
    print(f"  {'ok  ' if ok else 'FAIL'} {subject}: {detail}")
    if not ok:
        failures.append(f"{subject}: {detail}")


def quantity(text):
    """A Kubernetes quantity ("256Mi", "2", "500m") as a number."""
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(text))
    if not match or match.group(2) not in QUANTITY_UNITS:
        raise ValueError(f"not a quantity: {text!r}")
    return float(match.group(1)) * QUANTITY_UNITS[match.group(2)]


def key(obj):
    return f"{obj['kind']}/{obj['metadata']['name']}"


def namespace(obj):
    return obj["metadata"].get("namespace", "")


def selects(selector, labels):
    return bool(selector) and all(labels.get(name) == value for name, value in selector.items())


def pod_template(obj):
    return obj["spec"]["template"]


def config_path(container):
    """The file named by `--config` in the container's command or args (also inside `sh -c`)."""
    words = " ".join(container.get("command", []) + container.get("args", []))
    match = re.search(r"--config[ =](\S+)", words)
    return match.group(1) if match else None


def daemon_of(container):
    """Which tessera daemon a container runs, from its command (None for any other program)."""
    words = " ".join(container.get("command", []) + container.get("args", []))
    match = re.search(r"\btessera-(collector|aggregator|ingester)\b", words)
    return match.group(1) if match else None


def mounted_file(obj, container, path, config_maps):
    """The text of `path` in the container when a ConfigMap volume provides it, else None."""
    volumes = {volume["name"]: volume for volume in pod_template(obj)["spec"].get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        if os.path.dirname(path) != mount["mountPath"].rstrip("/"):
            continue
        config_map = volumes.get(mount["name"], {}).get("configMap")
        if config_map is None:
            continue
        data = config_maps.get((namespace(obj), config_map["name"]), {}).get("data", {})
        return data.get(os.path.basename(path))
    return None


def port_number(container, port):
    """A probe's port (a number or a port name) as the container's port number, or None."""
    for declared in container.get("ports", []):
        if port in (declared["containerPort"], declared.get("name")):
            return declared["containerPort"]
    return None


def check_statefulset_services(objects):
    print("StatefulSets have a headless Service of their serviceName:")
    services = {(namespace(o), o["metadata"]["name"]): o for o in objects if o["kind"] == "Service"}
    for obj in objects:
        if obj["kind"] != "StatefulSet":
            continue
        name = obj["spec"].get("serviceName")
        service = services.get((namespace(obj), name))
        labels = pod_template(obj)["metadata"].get("labels", {})
        if service is None:
            report(False, key(obj), f"no Service `{name}`")
        elif service["spec"].get("clusterIP") != "None":
            report(False, key(obj), f"Service `{name}` is not headless (clusterIP: None)")
        elif not selects(service["spec"].get("selector"), labels):
            report(False, key(obj), f"Service `{name}` does not select its pods")
        else:
            report(True, key(obj), f"headless Service `{name}` selects its pods")


def check_services_select(objects, workloads):
    print("Services select the pods of a workload:")
    for obj in objects:
        if obj["kind"] != "Service":
            continue
        selector = obj["spec"].get("selector")
        matched = [key(w) for w in workloads
                   if namespace(w) == namespace(obj) and selects(selector, pod_template(w)["metadata"].get("labels", {}))]
        report(bool(matched), key(obj), f"selects {', '.join(matched)}" if matched else f"selects no pods ({selector})")


def check_probes_and_configs(objects, config_maps):
    print("Containers have readiness and liveness probes on the right port; --config files exist:")
    for obj in objects:
        if obj["kind"] not in WORKLOAD_KINDS:
            continue
        for container in pod_template(obj)["spec"]["containers"]:
            subject = f"{key(obj)} container {container['name']}"
            telemetry_port = None
            path = config_path(container)
            if path is not None:
                text = mounted_file(obj, container, path, config_maps)
                if text is None:
                    report(False, subject, f"--config {path} is not in a ConfigMap mounted at {os.path.dirname(path)}")
                    continue
                telemetry = tomllib.loads(text).get("telemetry", {})
                listen = telemetry.get("listen", "")
                # The port is on every interface of the pod: its CPU profiler must be off, or
                # behind the password of a web config.
                profiler_open = telemetry.get("profiling", True) and "web_config" not in telemetry
                report(not profiler_open, subject,
                       "the CPU profiler is off or behind a web config" if not profiler_open
                       else f"{path} serves the CPU profiler on {listen} to anyone: set profiling = false or web_config")
                match = re.fullmatch(r"0\.0\.0\.0:(\d+)", listen)
                if not match:
                    report(False, subject, f"[telemetry] listen of {path} is `{listen}`, not 0.0.0.0:<port>")
                    continue
                telemetry_port = int(match.group(1))
                report(True, subject, f"--config {path} from its ConfigMap, telemetry on {listen}")
            elif daemon_of(container):
                report(False, subject, "runs a tessera daemon without --config")
                continue
            if obj["kind"] not in LONG_RUNNING_KINDS:
                continue
            for probe_name, tessera_path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
                probe = container.get(probe_name)
                if probe is None:
                    report(False, subject, f"no {probe_name}")
                    continue
                action = probe.get("httpGet") or probe.get("tcpSocket") or {}
                number = port_number(container, action.get("port"))
                if number is None:
                    report(False, subject, f"{probe_name} port {action.get('port')!r} is none of its ports")
                elif telemetry_port is not None and (number != telemetry_port or action.get("path") != tessera_path):
                    report(False, subject, f"{probe_name} is {action.get('path')} on {number}, "
                                           f"not {tessera_path} on the telemetry port {telemetry_port}")
                else:
                    where = f"GET {action['path']} on {number}" if "path" in action else f"TCP {number}"
                    report(True, subject, f"{probe_name} {where}")
            annotations = pod_template(obj)["metadata"].get("annotations", {})
            if annotations.get("prometheus.io/scrape") == "true":
                declared = [port["containerPort"] for port in container.get("ports", [])]
                port = int(annotations.get("prometheus.io/port", "0"))
                wanted = [telemetry_port] if telemetry_port is not None else declared
                report(port in wanted and annotations.get("prometheus.io/path") == "/metrics", subject,
                       f"scraped at :{port}{annotations.get('prometheus.io/path')}")


def check_memory(objects):
    print("Containers have memory requests and limits:")
    for obj in objects:
        if obj["kind"] not in WORKLOAD_KINDS:
            continue
        spec = pod_template(obj)["spec"]
        for container in spec.get("initContainers", []) + spec["containers"]:
            subject = f"{key(obj)} container {container['name']}"
            resources = container.get("resources", {})
            request = resources.get("requests", {}).get("memory")
            limit = resources.get("limits", {}).get("memory")
            if request is None or limit is None:
                report(False, subject, f"memory request {request}, limit {limit}")
            elif quantity(request) > quantity(limit):
                report(False, subject, f"memory request {request} above its limit {limit}")
            else:
                report(True, subject, f"memory request {request}, limit {limit}")


def check_disruption_budgets(objects, workloads):
    print("PodDisruptionBudgets select a workload:")
    for obj in objects:
        if obj["kind"] != "PodDisruptionBudget":
            continue
        selector = obj["spec"].get("selector", {}).get("matchLabels")
        matched = [key(w) for w in workloads
                   if w["kind"] in LONG_RUNNING_KINDS and namespace(w) == namespace(obj)
                   and selects(selector, pod_template(w)["metadata"].get("labels", {}))]
        report(bool(matched), key(obj), f"selects {', '.join(matched)}" if matched else f"selects no pods ({selector})")


def check_references(objects):
    print("Named ServiceAccounts, ConfigMaps and ClusterRoles exist:")
    present = {(o["kind"], namespace(o), o["metadata"]["name"]) for o in objects}
    for obj in objects:
        wanted = []
        if obj["kind"] in WORKLOAD_KINDS:
            spec = pod_template(obj)["spec"]
            if "serviceAccountName" in spec:
                wanted.append(("ServiceAccount", namespace(obj), spec["serviceAccountName"]))
            for volume in spec.get("volumes", []):
                if "configMap" in volume:
                    wanted.append(("ConfigMap", namespace(obj), volume["configMap"]["name"]))
        if obj["kind"] == "ClusterRoleBinding":
            wanted.append(("ClusterRole", "", obj["roleRef"]["name"]))
            for subject in obj.get("subjects", []):
                if subject["kind"] == "ServiceAccount":
                    wanted.append(("ServiceAccount", subject.get("namespace", ""), subject["name"]))
        for reference in wanted:
            report(reference in present, key(obj), f"{reference[0]} {reference[1]}/{reference[2]}".replace(" /", " "))


def daemon_configs(objects, config_maps):
    """Each tessera daemon's parsed config file, by daemon name."""
    configs = {}
    for obj in objects:
        if obj["kind"] not in LONG_RUNNING_KINDS:
            continue
        for container in pod_template(obj)["spec"]["containers"]:
            daemon, path = daemon_of(container), config_path(container)
            text = mounted_file(obj, container, path, config_maps) if daemon and path else None
            if text is not None:
                configs[daemon] = tomllib.loads(text)
    return configs


def check_placement_job(objects, config_maps, out_dir):
    print("The placement Job writes what the daemons read:")
    jobs = [o for o in objects if o["kind"] == "Job"
            and any(e["name"] == "ETCD_ENDPOINTS" for c in pod_template(o)["spec"]["containers"] for e in c.get("env", []))]
    if len(jobs) != 1:
        report(False, "placement Job", f"{len(jobs)} Jobs with ETCD_ENDPOINTS, not 1")
        return
    job = jobs[0]
    env = {e["name"]: e["value"] for e in pod_template(job)["spec"]["containers"][0].get("env", []) if "value" in e}
    with open(os.path.join(out_dir, "placement-init.env"), "w") as file:
        file.writelines(f"{name}={value}\n" for name, value in sorted(env.items()))
    configs = daemon_configs(objects, config_maps)
    endpoints = env.get("ETCD_ENDPOINTS", "").split(",")
    environment = env.get("TESSERA_ENVIRONMENT", "default")
    sources = {
        "collector [placement]": configs.get("collector", {}).get("placement"),
        "aggregator [placement]": configs.get("aggregator", {}).get("placement"),
        "aggregator [ingester.placement]": configs.get("aggregator", {}).get("ingester", {}).get("placement"),
        "ingester [placement.etcd]": configs.get("ingester", {}).get("placement", {}).get("etcd"),
    }
    for name, source in sources.items():
        if source is None:
            report(False, key(job), f"no {name}")
            continue
        same = source.get("endpoints") == endpoints and source.get("env") == environment
        report(same, key(job), f"{name}: endpoints {source.get('endpoints')}, env {source.get('env')!r}"
                               + ("" if same else f"; the Job writes {endpoints}, env {environment!r}"))
    statefulsets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "StatefulSet"}
    for tier, count_name, port in (("aggregator", "AGGREGATORS", 7400), ("ingester", "INGESTERS", 7500)):
        statefulset = statefulsets.get(f"tessera-{tier}")
        if statefulset is None:
            report(False, key(job), f"no StatefulSet tessera-{tier}")
            continue
        replicas = statefulset["spec"].get("replicas", 1)
        report(str(replicas) == env.get(count_name), key(job),
               f"{count_name}={env.get(count_name)}, StatefulSet/tessera-{tier} replicas {replicas}")
        config = configs.get(tier, {})
        listen = config.get("listen", "")
        report(listen == f"0.0.0.0:{port}", key(job), f"{tier} listens on {listen}, the Job registers port {port}")
        if tier == "ingester":
            service = statefulset["spec"]["serviceName"]
            wanted = f"${{env:POD_NAME}}.{service}.${{env:POD_NAMESPACE}}.svc:{port}"
            advertise = config.get("placement", {}).get("advertise")
            report(advertise == wanted, key(job), f"ingester advertise {advertise}"
                                                  + ("" if advertise == wanted else f", the Job registers {wanted}"))
        if tier == "aggregator":
            instance_id = config.get("instance_id")
            report(instance_id == "${env:POD_NAME}", key(job), f"aggregator instance_id {instance_id}, the Job registers pod names")
    factor = int(env.get("REPLICATION_FACTOR", "1"))
    aggregators = int(env.get("AGGREGATORS", "0"))
    report(aggregators > 0 and aggregators % factor == 0, key(job),
           f"AGGREGATORS={aggregators} makes whole shard sets of REPLICATION_FACTOR={factor}")


def extract_files(objects, out_dir):
    print(f"ConfigMap files written to {out_dir}:")
    os.makedirs(out_dir, exist_ok=True)
    for obj in objects:
        if obj["kind"] != "ConfigMap":
            continue
        for name, text in obj.get("data", {}).items():
            if not name.endswith((".toml", ".sh")):
                continue
            target = os.path.join(out_dir, name)
            if os.path.exists(target):
                report(False, key(obj), f"a second ConfigMap holds {name}")
                continue
            with open(target, "w") as file:
                file.write(text)
            print(f"  {key(obj)}: {name}")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[1])
    rendered, out_dir = sys.argv[1], sys.argv[2]
    with open(rendered) as file:
        objects = [obj for obj in yaml.safe_load_all(file) if obj]
    config_maps = {(namespace(o), o["metadata"]["name"]): o for o in objects if o["kind"] == "ConfigMap"}
    workloads = [o for o in objects if o["kind"] in WORKLOAD_KINDS]
    print(f"{rendered}: {len(objects)} objects")
    check_statefulset_services(objects)
    check_services_select(objects, workloads)
    check_probes_and_configs(objects, config_maps)
    check_memory(objects)
    check_disruption_budgets(objects, workloads)
    check_references(objects)
    extract_files(objects, out_dir)
    check_placement_job(objects, config_maps, out_dir)
    if failures:
        print(f"{len(failures)} structural check(s) failed in {rendered}:")
        for failure in failures:
            print(f"  {failure}")
        sys.exit(1)


if __name__ == "__main__":
    main()
