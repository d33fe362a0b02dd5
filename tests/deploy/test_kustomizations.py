"""deploy/kubernetes is kustomize's: each folder's kustomization.yaml lists exactly the manifests beside it (a file
left out would never be applied), every path it names exists, and the disaggregated overlay's delete patch names
an object of the base it overlays. (`kubectl kustomize` builds each folder; kubectl is not needed for `make test`.)"""
from pathlib import Path

import yaml

from tests.deploy.kube import KUBE, KUSTOMIZATION, find, manifest_files

FOLDERS = ("base", "disaggregated", "leaderworkerset", "monitoring", "autoscaling", "inference-gateway")


def kustomization(folder: Path) -> dict:
    doc = yaml.safe_load((folder / KUSTOMIZATION).read_text())
    assert doc["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and doc["kind"] == "Kustomization", folder
    return doc


def test_every_folder_is_a_kustomization_listing_its_manifests():
    assert sorted(p.name for p in KUBE.iterdir() if p.is_dir()) == sorted(FOLDERS)
    assert kustomization(KUBE)["resources"] == ["base"]  # `kubectl apply -k deploy/kubernetes`: the base
    assert [p.name for p in KUBE.glob("*.yaml")] == [KUSTOMIZATION]
    listed = set()
    for name in FOLDERS:
        folder = KUBE / name
        resources = kustomization(folder)["resources"]
        for resource in resources:
            assert (folder / resource).exists(), (name, resource)
        files = {folder / r for r in resources if (folder / r).is_file()}
        assert files == set(folder.glob("*.yaml")) - {folder / KUSTOMIZATION}, name
        listed |= files
    assert listed == set(manifest_files())


def deleted_from_base(overlay: str) -> list[tuple[str, str]]:
    """(kind, name) of each object the overlay's delete patches remove, each checked to be one of the base's."""
    folder = kustomization(KUBE / overlay)
    assert "../base" in folder["resources"]
    base = [yaml.safe_load((KUBE / "base" / r).read_text()) for r in kustomization(KUBE / "base")["resources"]]
    out = []
    for patch in folder["patches"]:
        deleted = yaml.safe_load(patch["patch"])
        assert deleted.pop("$patch") == "delete"
        assert find(deleted["kind"], deleted["metadata"]["name"])["apiVersion"] == deleted["apiVersion"]
        assert any((doc["kind"], doc["metadata"]["name"]) == (deleted["kind"], deleted["metadata"]["name"]) for doc in base)
        out.append((deleted["kind"], deleted["metadata"]["name"]))
    return out


def test_the_disaggregated_overlay_replaces_the_base_engines():
    assert deleted_from_base("disaggregated") == [("Deployment", "tinyvllm")]


def test_the_inference_gateway_overlay_replaces_the_router():
    assert sorted(deleted_from_base("inference-gateway")) == [("Deployment", "tinyvllm-router"),
                                                             ("Service", "tinyvllm-router")]
