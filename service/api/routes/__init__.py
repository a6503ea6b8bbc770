"""One router per resource; resource routers carry the full /v1 prefix (it is the metrics route label)."""

V1 = "/v1"
