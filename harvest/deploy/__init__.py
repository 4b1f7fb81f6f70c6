"""A one-host PD deployment: SGLang prefill worker, harvest decode worker, sglang-router."""

from harvest.deploy.pd_deployment import DeployConfig, PDDeployment

__all__ = ["DeployConfig", "PDDeployment"]
