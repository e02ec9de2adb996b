#!/usr/bin/env python3
"""Checks rendered Kubernetes manifests of encore-processor against the binary and the image.

Usage: check_k8s_manifests.py BINARY RENDERED.yaml [--dockerfile Dockerfile] [--compose docker-compose.yml]
       check_k8s_manifests.py --same A.yaml B.yaml    (the same objects, in any order)

For the StatefulSet that runs the image docker-compose.yml builds, as check_compose_commands.py does
for compose: its mounted ConfigMaps are written to a temporary directory, its Secret volumes as
files of placeholder values (their keys listed in `items`), every mount path in the arguments, the
environment and the config files replaced by its directory there, and the container's arguments
run with `--check` (every option, config key and @/path secret must be accepted) and with
`--print-config`, whose effective values are checked against the manifests: the probes and the
metrics Service reach --http-listen, --state-dir is a claimed volume, --instance-id is the pod's
name, the grace period outlasts the drain; and the pod runs as the Dockerfile's non-root USER on a
read-only root filesystem. Prints one line per check; exits non-zero on the first failure.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

PLACEHOLDER_SECRET = "check-only-placeholder-secret-0123456789abcdef"


class CheckFailed(Exception):
    pass


def require(condition, message):
    if not condition:
        raise CheckFailed(message)


def ok(message):
    print(f"ok: {message}")


def image_repository(image):
    """`registry:5000/team/encore-processor:1.2@sha256:...` → `encore-processor`."""
    name = image.split("@")[0].rsplit("/", 1)[-1]
    return name.split(":")[0]


def built_image(compose_path):
    with open(compose_path) as f:
        compose = yaml.safe_load(f)
    names = {image_repository(s["image"]) for s in compose.get("services", {}).values() if "build" in s}
    require(len(names) == 1, f"{compose_path}: expected one service that builds the image, found {sorted(names)}")
    return names.pop()


def dockerfile_user(path):
    users = [line.split()[1] for line in open(path) if line.strip().upper().startswith("USER ")]
    require(users, f"{path}: no USER instruction: the image runs as root")
    user = users[-1].split(":")[0]
    require(user.isdigit(), f"{path}: USER {user} is not numeric: runAsNonRoot cannot verify a name")
    require(int(user) != 0, f"{path}: USER 0 is root")
    return int(user)


def find_processor(documents, repository):
    found = []
    for document in documents:
        if document.get("kind") != "StatefulSet":
            continue
        for container in document["spec"]["template"]["spec"]["containers"]:
            if image_repository(container["image"]) == repository:
                found.append((document, container))
    require(len(found) == 1, f"expected one StatefulSet container running {repository}, found {len(found)}")
    return found[0]


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def resolve_port(port, container):
    if isinstance(port, int):
        return port
    named = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == port]
    require(named, f"port '{port}' is not a named port of container {container['name']}")
    return named[0]


def check_security(pod, container, user):
    pod_context = pod.get("securityContext", {})
    context = {**pod_context, **container.get("securityContext", {})}
    require(context.get("runAsNonRoot") is True, "runAsNonRoot must be true")
    require(context.get("runAsUser") == user,
            f"runAsUser {context.get('runAsUser')} is not the Dockerfile's USER {user}")
    require(context.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem must be true")
    require(context.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation must be false")
    require("ALL" in context.get("capabilities", {}).get("drop", []), "capabilities must drop ALL")
    require(context.get("seccompProfile", {}).get("type") == "RuntimeDefault", "seccompProfile must be RuntimeDefault")
    ok(f"non-root (uid {user}, the Dockerfile's USER), read-only root, no capabilities, no escalation,"
       " RuntimeDefault seccomp")
    resources = container.get("resources", {})
    for kind in ("requests", "limits"):
        require({"cpu", "memory"} <= set(resources.get(kind, {})), f"resources.{kind} must set cpu and memory")
    ok("resources: requests and limits of cpu and memory")


def materialize(statefulset, container, documents, root):
    """Writes every mount of the container under `root`; returns {mount path: local directory}."""
    pod = statefulset["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    claims = {c["metadata"]["name"] for c in statefulset["spec"].get("volumeClaimTemplates", [])}
    config_maps = {d["metadata"]["name"]: d for d in documents if d.get("kind") == "ConfigMap"}
    mounts = {}
    for index, mount in enumerate(container.get("volumeMounts", [])):
        local = os.path.join(root, f"mount{index}")
        os.makedirs(local)
        mounts[mount["mountPath"]] = local
        if mount["name"] in claims:
            continue
        volume = volumes.get(mount["name"])
        require(volume, f"volumeMount {mount['name']} names no volume or claim template")
        if "configMap" in volume:
            name = volume["configMap"]["name"]
            require(name in config_maps, f"volume {mount['name']}: ConfigMap {name} is not among the manifests")
            data = config_maps[name].get("data", {})
            items = volume["configMap"].get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                with open(os.path.join(local, item["path"]), "w") as f:
                    f.write(data[item["key"]])
        elif "secret" in volume:
            items = volume["secret"].get("items")
            require(items, f"volume {mount['name']}: list the Secret's keys in items, so they can be checked")
            for item in items:
                with open(os.path.join(local, item["path"]), "w") as f:
                    f.write(PLACEHOLDER_SECRET + "\n")
        else:
            require("emptyDir" in volume, f"volume {mount['name']}: only configMap, secret and emptyDir are handled")
    return mounts


def substitute(text, mounts):
    """Each mount path in `text` (a whole path or its start) replaced by its local directory, in one pass."""
    paths = {m.rstrip("/"): local for m, local in mounts.items()}
    alternatives = "|".join(re.escape(p) for p in sorted(paths, key=len, reverse=True))
    pattern = r"(?<![\w.-])(" + alternatives + r")(?=/|\s|,|$)"
    return re.sub(pattern, lambda match: paths[match.group(1)], text, flags=re.M)


def unsubstitute(text, mounts):
    for mount_path, local in sorted(mounts.items(), key=lambda item: len(item[1]), reverse=True):
        text = text.replace(local, mount_path.rstrip("/"))
    return text


def rewrite_config_files(mounts):
    for local in mounts.values():
        for name in os.listdir(local):
            path = os.path.join(local, name)
            with open(path) as f:
                text = f.read()
            with open(path, "w") as f:
                f.write(substitute(text, mounts))


def container_environment(container, pod_name, mounts):
    environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")}
    for entry in container.get("env", []):
        if "value" in entry:
            environment[entry["name"]] = substitute(str(entry["value"]), mounts)
            continue
        field = entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        require(field == "metadata.name", f"env {entry['name']}: only values and fieldRef metadata.name are handled")
        environment[entry["name"]] = pod_name
    require(not container.get("envFrom"), "envFrom is not handled: set variables one by one")
    return environment


def expand(argument, environment):
    """Kubernetes' $(VAR) in args: the container's variable, $$ a literal $."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else environment.get(m.group(1), m.group(0)), argument)


def secret_file_options(container, mounts):
    """Values given to --controller-secret-file: on the command line, in the environment, in config files."""
    values = []
    args = container.get("args", [])
    for index, arg in enumerate(args):
        if arg == "--controller-secret-file" and index + 1 < len(args):
            values.append(args[index + 1])
        elif arg.startswith("--controller-secret-file="):
            values.append(arg.split("=", 1)[1])
    values += [e["value"] for e in container.get("env", []) if e["name"] == "ENCORE_CONTROLLER_SECRET_FILE"]
    for local in mounts.values():
        for name in os.listdir(local):
            for line in open(os.path.join(local, name), errors="replace"):
                key, _, value = line.partition("=")
                if key.strip() == "encore.controller-secret-file":
                    values.append(value.strip())
    return values


def effective_configuration(output, mounts):
    values = {}
    for line in output.splitlines():
        if line.startswith("#") or "=" not in line:
            continue
        key, _, rest = line.partition("=")
        value, _, source = rest.partition("  # ")
        values[key] = (unsubstitute(value, mounts), source)
    return values


def check_probes(container, port):
    expected = {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    for probe, path in expected.items():
        get = container.get(probe, {}).get("httpGet")
        require(get, f"{probe}: missing, or not an httpGet")
        require(get.get("path") == path, f"{probe}: path {get.get('path')}, expected {path}")
        require(get.get("scheme", "HTTP") == "HTTP", f"{probe}: the operations endpoint serves plain HTTP")
        probe_port = resolve_port(get["port"], container)
        require(probe_port == port, f"{probe}: port {probe_port}, but --http-listen serves {port}")
    ok(f"startup and liveness probe /healthz, readiness /readyz, on --http-listen's port {port}")


def check_services(documents, statefulset, container, port):
    labels = statefulset["spec"]["template"]["metadata"].get("labels", {})
    services = [d for d in documents if d.get("kind") == "Service" and selects(d["spec"].get("selector"), labels)]
    headless = [s for s in services if s["spec"].get("clusterIP") == "None"]
    require(
        any(s["metadata"]["name"] == statefulset["spec"].get("serviceName") for s in headless),
        f"no headless Service named {statefulset['spec'].get('serviceName')} (the StatefulSet's serviceName)"
        " selects the pods")
    metrics = [
        s for s in services for p in s["spec"].get("ports", [])
        if p["port"] == 9464 and resolve_port(p.get("targetPort", p["port"]), container) == port]
    require(metrics, f"no Service selecting the pods serves port 9464 from the pods' port {port}")
    pdbs = [d for d in documents if d.get("kind") == "PodDisruptionBudget"
            and selects(d["spec"].get("selector", {}).get("matchLabels"), labels)]
    require(pdbs, "no PodDisruptionBudget selects the pods")
    ok(f"headless Service {statefulset['spec']['serviceName']}, metrics Service on 9464, PodDisruptionBudget")


def check_writable_paths(statefulset, container, state_dir):
    claims = {c["metadata"]["name"] for c in statefulset["spec"].get("volumeClaimTemplates", [])}
    mounts = {m["mountPath"].rstrip("/"): m for m in container.get("volumeMounts", [])}
    require(state_dir not in ("", "none"), "--state-dir is off: a StatefulSet is for the state store")
    state_mount = mounts.get(state_dir.rstrip("/"))
    require(state_mount and state_mount["name"] in claims,
            f"--state-dir {state_dir} is not the mount of a volumeClaimTemplate ({sorted(claims)})")
    require(not state_mount.get("readOnly"), f"--state-dir {state_dir} is mounted read-only")
    require("/tmp" in mounts and not mounts["/tmp"].get("readOnly"), "/tmp must be a writable volume")
    ok(f"--state-dir {state_dir} on the claim '{state_mount['name']}', /tmp a volume")


def check_processor(binary, documents, dockerfile, compose):
    repository = built_image(compose)
    statefulset, container = find_processor(documents, repository)
    ok(f"StatefulSet {statefulset['metadata']['name']} runs {container['image']}"
       f" (docker-compose.yml builds {repository})")
    require(not container.get("command"), "command is set: leave the image's ENTRYPOINT, pass args")
    require(container.get("args", [])[:1] == ["run"], "args must start with the subcommand run")
    pod = statefulset["spec"]["template"]["spec"]
    check_security(pod, container, dockerfile_user(dockerfile))

    pod_name = statefulset["metadata"]["name"] + "-0"
    root = tempfile.mkdtemp(prefix="check-k8s-")
    try:
        mounts = materialize(statefulset, container, documents, root)
        rewrite_config_files(mounts)
        for value in secret_file_options(container, mounts):
            value = unsubstitute(value, mounts)
            require(not value.startswith("@"),
                    f"--controller-secret-file {value}: the option takes a path;"
                    f" it would sign with the text {value} as the key")
        environment = container_environment(container, pod_name, mounts)
        args = [substitute(expand(a, environment), mounts) for a in container["args"]]
        shown = " ".join(container["args"])
        result = subprocess.run([binary] + args + ["--check"], env=environment, capture_output=True, text=True)
        require(result.returncode == 0,
                f"{binary} {shown} --check failed:\n{unsubstitute(result.stdout + result.stderr, mounts)}")
        ok(f"{shown} --check: {result.stdout.strip()}")
        result = subprocess.run([binary] + args + ["--print-config"], env=environment, capture_output=True, text=True)
        require(result.returncode == 0,
                f"{binary} {shown} --print-config failed:\n{unsubstitute(result.stderr, mounts)}")
        config = effective_configuration(result.stdout, mounts)
    finally:
        shutil.rmtree(root)

    instance, source = config.get("encore.instance-id", ("", ""))
    require(instance == pod_name and source not in ("", "default"),
            f"--instance-id is {repr(instance) if instance else 'not set (the host name)'}: set it to the pod's name"
            " (ENCORE_INSTANCE_ID from the field metadata.name, or --instance-id $(POD_NAME))")
    ok(f"--instance-id is the pod's name ({source})")
    listen = config.get("encore.http-listen", ("", ""))[0]
    require(re.fullmatch(r".*:\d+", listen), f"--http-listen is '{listen}': the probes need the operations endpoint")
    check_probes(container, int(listen.rsplit(":", 1)[1]))
    check_services(documents, statefulset, container, int(listen.rsplit(":", 1)[1]))
    check_writable_paths(statefulset, container, config["encore.state-dir"][0])

    call_timeout = int(config["encore.call-timeout-ms"][0])
    drain_text = config.get("encore.drain-timeout-ms", ("", ""))[0]
    drain = int(drain_text) if drain_text.isdigit() else call_timeout + 5000
    grace = pod.get("terminationGracePeriodSeconds", 30)
    # After the drain: outputs flushed, offsets committed, the store checkpointed and closed.
    require(grace * 1000 >= drain + 10_000,
            f"terminationGracePeriodSeconds {grace} does not outlast the {drain} ms drain by 10 s")
    ok(f"terminationGracePeriodSeconds {grace} outlasts the {drain} ms drain by {grace - drain // 1000} s")


def same_objects(path_a, path_b):
    def load(path):
        with open(path) as f:
            return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(f) if d}
    a, b = load(path_a), load(path_b)
    require(sorted(a) == sorted(b), f"{path_a} and {path_b} differ in objects: {sorted(set(a) ^ set(b))}")
    differing = [key for key in a if a[key] != b[key]]
    require(not differing, f"{path_a} and {path_b} differ in {differing}")
    ok(f"the renderer's output is kubectl kustomize's ({len(a)} objects)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--same", action="store_true", help="compare two renderings instead")
    parser.add_argument("--dockerfile", default="Dockerfile")
    parser.add_argument("--compose", default="docker-compose.yml")
    parser.add_argument("first", help="BINARY (or the first rendering with --same)")
    parser.add_argument("second", help="RENDERED.yaml (or the second rendering with --same)")
    args = parser.parse_args()
    try:
        if args.same:
            same_objects(args.first, args.second)
        else:
            with open(args.second) as f:
                documents = [d for d in yaml.safe_load_all(f) if d]
            check_processor(args.first, documents, args.dockerfile, args.compose)
    except CheckFailed as failure:
        print(f"FAILED: {failure}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
