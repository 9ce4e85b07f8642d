"""HTTP gateway: the versioned JSON API (/v1/...), its OpenAPI document, health and readiness."""
