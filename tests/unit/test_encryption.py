"""The keys an EncryptionConfiguration names for a resource (:mod:`kube.encryption`)."""

from __future__ import annotations

import pytest
import yaml

from kube.encryption import EncryptionConfigError, keys_for

CONFIG = yaml.safe_load(
    """
apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
  - resources: [secrets, configmaps]
    providers:
      - aescbc:
          keys:
            - {name: key2, secret: c2Vjb25kIGtleSBvZiAzMiBieXRlcyBleGFjdGx5ISE=}
            - {name: key1, secret: Zmlyc3Qga2V5IG9mIDMyIGJ5dGVzIGV4YWN0bHkhISE=}
      - identity: {}
  - resources: ["*.apps"]
    providers:
      - kms: {apiVersion: v2, name: vault, endpoint: unix:///kms.sock}
  - resources: ["*.*"]
    providers:
      - secretbox: {keys: [{name: box, secret: c2VjcmV0}]}
"""
)


def test_the_first_entry_naming_a_resource_gives_its_keys_in_order() -> None:
    assert keys_for(CONFIG, "", "secrets") == ("aescbc:v1:key2", "aescbc:v1:key1", "identity")
    assert keys_for(CONFIG, "apps", "deployments") == ("kms:v2:vault",)
    assert keys_for(CONFIG, "batch", "jobs") == ("secretbox:v1:box",)
    assert keys_for({**CONFIG, "resources": CONFIG["resources"][:1]}, "", "pods") == ()


def test_a_file_that_is_no_encryption_configuration_is_refused() -> None:
    with pytest.raises(EncryptionConfigError, match="EncryptionConfiguration"):
        keys_for({"kind": "Config", "apiVersion": "v1"}, "", "secrets")
    broken = {**CONFIG, "resources": [{"resources": ["secrets"], "providers": [{"rot13": {}}]}]}
    with pytest.raises(EncryptionConfigError, match="rot13"):
        keys_for(broken, "", "secrets")
