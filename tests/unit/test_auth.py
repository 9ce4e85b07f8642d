"""Tokens files, tenants files and the OpenAPI security declaration (no servers)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from services.gateway import openapi
from services.gateway.auth import PUBLIC_PATHS, SCHEME, Role, Tokens, TokensError
from shared.core import TenantPolicy
from shared.tenants import TenantsError, load_home_cells, load_tenants

TOKEN = "a-token-of-sixteen+"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "f.yaml"
    path.write_text(text)
    return path


def test_tokens_map_to_tenant_and_role_by_token_or_digest(tmp_path: Path) -> None:
    digest = hashlib.sha256(b"another-token-0123").hexdigest()
    text = f'tokens:\n  - {{token: "{TOKEN}", tenant: a}}\n  - {{sha256: "{digest.upper()}", tenant: ops, role: admin}}'
    tokens = Tokens.load(write(tmp_path, text))
    user, admin = tokens.lookup(TOKEN), tokens.lookup("another-token-0123")
    assert user is not None and (user.tenant, user.role, user.admin) == ("a", Role.USER, False)
    assert admin is not None and admin.admin and admin.may_see("anyone")
    assert user.may_see("a") and not user.may_see("b")
    assert tokens.lookup("a-token-of-sixteen") is None and tokens.lookup("") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tokens: []", "non-empty list"),
        ("nope: 1", "non-empty list"),
        ('tokens:\n  - {token: "short", tenant: a}', "at least 16"),
        (f'tokens:\n  - {{token: "{TOKEN}"}}', "tokens[0]: 'tenant'"),
        (f'tokens:\n  - {{token: "{TOKEN}", tenant: a, role: root}}', "'role' must be user or admin"),
        (f'tokens:\n  - {{token: "{TOKEN}", sha256: "00", tenant: a}}', "exactly one"),
        ('tokens:\n  - {sha256: "xyz", tenant: a}', "64 hex digits"),
        (f'tokens:\n  - {{token: "{TOKEN}", tenant: a, colour: red}}', "unknown field(s) colour"),
        (f'tokens:\n  - {{token: "{TOKEN}", tenant: a}}\n  - {{token: "{TOKEN}", tenant: b}}', "tokens[1]: the same"),
        ("tokens: [", "f.yaml"),
    ],
)
def test_bad_tokens_files_name_the_entry(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TokensError, match=re.escape(message)):
        Tokens.load(write(tmp_path, text))


def test_tenants_file_gives_the_cores_tenant_policies(tmp_path: Path) -> None:
    got = load_tenants(write(tmp_path, "tenants:\n  a: {quota_gpus: 16, weight: 2}\n  b: {}\n"))
    assert got == {"a": TenantPolicy(weight=2.0, quota_gpus=16), "b": TenantPolicy()}


def test_tenants_file_gives_the_routers_home_cells(tmp_path: Path) -> None:
    path = write(tmp_path, "tenants:\n  a: {quota_gpus: 16, cell: west-2}\n  b: {weight: 2}\n")
    assert load_home_cells(path) == {"a": "west-2"}
    assert load_tenants(path) == {"a": TenantPolicy(quota_gpus=16), "b": TenantPolicy(weight=2.0)}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tenants: [a]", "mapping under 'tenants'"),
        ("tenants:\n  a: {quota_gpus: -1}", "tenants.a.quota_gpus"),
        ("tenants:\n  a: {quota_gpus: 1.5}", "tenants.a.quota_gpus"),
        ("tenants:\n  a: {weight: 0}", "tenants.a.weight"),
        ("tenants:\n  a: {quota: 3}", "tenants.a: expected"),
        ("tenants:\n  a: {cell: c.1}", "tenants.a.cell: must be a cell name"),
        ("tenants:\n  a: {cell: 7}", "tenants.a.cell: must be a cell name"),
    ],
)
def test_bad_tenants_files_name_the_tenant(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TenantsError, match=message):
        load_tenants(write(tmp_path, text))


def test_openapi_declares_bearer_security_and_leaves_probes_open() -> None:
    doc = openapi.document()
    assert doc["components"]["securitySchemes"][SCHEME] == {
        "type": "http",
        "scheme": "bearer",
        "description": doc["components"]["securitySchemes"][SCHEME]["description"],
    }
    assert doc["security"] == [{SCHEME: []}]
    for path, ops in doc["paths"].items():
        for op in ops.values():
            if path in PUBLIC_PATHS:
                assert op["security"] == []
            else:
                assert "401" in op["responses"] and "security" not in op
