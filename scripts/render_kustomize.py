#!/usr/bin/env python3
"""Renders a kustomization as `kubectl kustomize DIR` would, for the fields deploy/k8s uses.

Usage: render_kustomize.py DIR [-o FILE]
Handles: `resources` (local YAML files), `namespace`, `configMapGenerator` (files and literals,
with kustomize's content-hash name suffix and the references to it in pod templates),
`generatorOptions.disableNameSuffixHash`, `images` (newName, newTag, digest), `labels` (metadata
labels only: no includeSelectors, no includeTemplates). Any other field is an error, so a
kustomization that grew past this renderer fails the check instead of rendering something else.
"""
import argparse
import hashlib
import json
import os
import sys

import yaml

HANDLED = {
    "apiVersion", "kind", "resources", "namespace", "configMapGenerator", "generatorOptions", "images",
    "labels",
}
CLUSTER_SCOPED = {
    "Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "PersistentVolume",
    "StorageClass", "PriorityClass", "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration",
}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}


class RenderError(Exception):
    pass


def name_hash(config_map):
    """kustomize's suffix: sha256 of the Go JSON of kind, data and an empty name (kustomize hashes the
    generated map before naming it); 10 hex digits, five of them swapped for letters."""
    fields = {"kind": "ConfigMap", "name": "", "data": config_map.get("data", {})}
    encoded = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # Go's encoding/json escapes these for HTML safety.
    for raw, escaped in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"), ("\u2028", "\\u2028"),
                         ("\u2029", "\\u2029")):
        encoded = encoded.replace(raw, escaped)
    digest = hashlib.sha256(encoded.encode()).hexdigest()[:10]
    return digest.translate(str.maketrans("013ae", "ghkmt"))


def generate_config_map(base, spec, hashed):
    unknown = set(spec) - {"name", "files", "literals"}
    if unknown:
        raise RenderError(f"configMapGenerator {spec.get('name')}: unsupported fields {sorted(unknown)}")
    data = {}
    for entry in spec.get("files", []):
        key, _, path = entry.rpartition("=") if "=" in entry else (os.path.basename(entry), "", entry)
        with open(os.path.join(base, path)) as f:
            data[key] = f.read()
    for literal in spec.get("literals", []):
        key, _, value = literal.partition("=")
        data[key] = value
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": spec["name"]}, "data": data}
    generated_name = spec["name"] + ("-" + name_hash(config_map) if hashed else "")
    config_map["metadata"]["name"] = generated_name
    return config_map, generated_name


def pod_specs(document):
    if document.get("kind") in WORKLOADS:
        yield document["spec"]["template"]["spec"]
    elif document.get("kind") == "CronJob":
        yield document["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    elif document.get("kind") == "Pod":
        yield document["spec"]


def containers(pod):
    return pod.get("initContainers", []) + pod.get("containers", [])


def rename_config_maps(document, renamed):
    for pod in pod_specs(document):
        for volume in pod.get("volumes", []):
            if "configMap" in volume:
                volume["configMap"]["name"] = renamed.get(volume["configMap"]["name"], volume["configMap"]["name"])
            for source in volume.get("projected", {}).get("sources", []):
                if "configMap" in source:
                    source["configMap"]["name"] = renamed.get(source["configMap"]["name"], source["configMap"]["name"])
        for container in containers(pod):
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("configMapKeyRef")
                if ref:
                    ref["name"] = renamed.get(ref["name"], ref["name"])
            for source in container.get("envFrom", []):
                ref = source.get("configMapRef")
                if ref:
                    ref["name"] = renamed.get(ref["name"], ref["name"])


def set_images(document, images):
    for pod in pod_specs(document):
        for container in containers(pod):
            image = container["image"]
            name = image.split("@")[0]
            if ":" in name.rsplit("/", 1)[-1]:
                name = name.rsplit(":", 1)[0]
            for rule in images:
                if rule["name"] != name:
                    continue
                unknown = set(rule) - {"name", "newName", "newTag", "digest"}
                if unknown:
                    raise RenderError(f"images {rule['name']}: unsupported fields {sorted(unknown)}")
                new = rule.get("newName", name)
                if "digest" in rule:
                    new += "@" + rule["digest"]
                elif "newTag" in rule:
                    new += ":" + str(rule["newTag"])
                elif image != name:
                    new += image[len(name):]
                container["image"] = new


def add_labels(document, labels):
    document.setdefault("metadata", {}).setdefault("labels", {}).update(labels)


def render(base):
    with open(os.path.join(base, "kustomization.yaml")) as f:
        kustomization = yaml.safe_load(f)
    unknown = set(kustomization) - HANDLED
    if unknown:
        raise RenderError(f"{base}/kustomization.yaml: fields this renderer does not handle: {sorted(unknown)}")
    documents = []
    for resource in kustomization.get("resources", []):
        path = os.path.join(base, resource)
        if not os.path.isfile(path):
            raise RenderError(f"resource {resource}: only local files are handled")
        with open(path) as f:
            documents += [d for d in yaml.safe_load_all(f) if d]
    options = kustomization.get("generatorOptions", {})
    if set(options) - {"disableNameSuffixHash"}:
        raise RenderError(f"generatorOptions: unsupported fields {sorted(set(options) - {'disableNameSuffixHash'})}")
    renamed = {}
    for spec in kustomization.get("configMapGenerator", []):
        config_map, generated_name = generate_config_map(base, spec, not options.get("disableNameSuffixHash"))
        renamed[spec["name"]] = generated_name
        documents.append(config_map)
    labels = {}
    for entry in kustomization.get("labels", []):
        if entry.get("includeSelectors") or entry.get("includeTemplates"):
            raise RenderError("labels: includeSelectors and includeTemplates are not handled")
        labels.update(entry.get("pairs", {}))
    namespace = kustomization.get("namespace")
    for document in documents:
        if namespace and document.get("kind") not in CLUSTER_SCOPED:
            document["metadata"]["namespace"] = namespace
        rename_config_maps(document, renamed)
        set_images(document, kustomization.get("images", []))
        if labels:
            add_labels(document, labels)
    return documents


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("-o", "--output", help="write here instead of standard output")
    args = parser.parse_args()
    try:
        documents = render(args.directory)
    except (RenderError, OSError, yaml.YAMLError, KeyError) as error:
        print(f"render_kustomize: {error}", file=sys.stderr)
        return 1
    text = yaml.safe_dump_all(documents, sort_keys=True, default_flow_style=False)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
