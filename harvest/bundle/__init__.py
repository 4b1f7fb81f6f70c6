"""The offline bundle for GPU hosts without network: build it here, install it there with install_bundle.py."""

from harvest.bundle.bundle_builder import BundleSpec, build_bundle

__all__ = ["BundleSpec", "build_bundle"]
