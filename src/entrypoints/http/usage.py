"""The tenant's usage against its limits (docs/http-api.md, "Usage"): what its streams and
bytes stand at, read now. One use case (`application.tenant_limits.TenantUsage`)."""

from __future__ import annotations

from litestar import Controller, Request, get

from application.tenant_limits import UsageView
from entrypoints.http.streams import API_PREFIX, EVERY_ROUTE, authenticated
from entrypoints.openapi import Answer, documented


class UsageController(Controller):
    path = API_PREFIX + "/usage"
    tags = ["usage"]

    @get(
        "",
        operation_id="getUsage",
        summary="What the caller's tenant holds against its limits",
        operation_class=documented(
            Answer(
                200,
                "The tenant's streams and bytes, counted now, and its limits (null: none)",
                UsageView,
            ),
            problems=(*EVERY_ROUTE, "forbidden"),
        ),
    )
    async def get_usage(self, request: Request) -> UsageView:
        services, caller = await authenticated(request)
        return await services.tenant_usage(caller)
