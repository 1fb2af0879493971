"""The token routes (docs/http-api.md, "Tokens"): mint, list and revoke the caller's tenant's
tokens over HTTP. One use case each (`application.tokens`)."""

from __future__ import annotations

from typing import Annotated

from litestar import Controller, Request, Response, delete, get, post
from litestar.params import Parameter

from application.tokens import (
    DEFAULT_LIST_LIMIT,
    MAX_LIST_LIMIT,
    TOKEN_ID_PATTERN,
    MintedToken,
    TokenList,
    TokenRequest,
)
from entrypoints.http.body import decode_body
from entrypoints.http.streams import API_PREFIX, EVERY_ROUTE, WITH_A_BODY, authenticated
from entrypoints.openapi import Answer, Link, documented


class TokensController(Controller):
    path = API_PREFIX + "/tokens"
    tags = ["tokens"]

    @post(
        "",
        operation_id="mintToken",
        summary="Mint a token in the caller's tenant (shown once)",
        operation_class=documented(
            Answer(
                201,
                "Minted: the token itself is in this answer only",
                MintedToken,
                links=(Link("revokeToken", {"token_id": "$response.body#/id"}),),
            ),
            problems=(*EVERY_ROUTE, *WITH_A_BODY, "forbidden", "quota-exhausted"),
            request_body=TokenRequest,
        ),
    )
    async def mint_token(self, request: Request) -> Response[MintedToken]:
        services, caller = await authenticated(request)
        body = await decode_body(request, TokenRequest)
        minted = await services.mint_token(caller, body)
        return Response(minted, status_code=201, headers={"Cache-Control": "no-store"})

    @get(
        "",
        operation_id="listTokens",
        summary="List the tenant's tokens (never a token itself), a page at a time",
        operation_class=documented(
            Answer(
                200,
                "The tenant's tokens after `after` by creation, revoked and expired ones included",
                TokenList,
            ),
            problems=(*EVERY_ROUTE, "forbidden", "cursor-unknown"),
        ),
    )
    async def list_tokens(
        self,
        request: Request,
        limit: Annotated[
            int,
            Parameter(ge=1, le=MAX_LIST_LIMIT, description="at most this many tokens"),
        ] = DEFAULT_LIST_LIMIT,
        after: Annotated[
            str | None,
            Parameter(
                description="exclusive: the tokens created after this token (`next_after`)",
                pattern=TOKEN_ID_PATTERN,
            ),
        ] = None,
    ) -> TokenList:
        services, caller = await authenticated(request)
        return await services.tenant_tokens.list(caller, after, limit)

    @delete(
        "/{token_id:str}",
        operation_id="revokeToken",
        summary="Revoke a token: refused everywhere within 2 seconds",
        status_code=204,
        operation_class=documented(
            Answer(204, "Revoked (revoking a revoked token again is fine)"),
            problems=(*EVERY_ROUTE, "forbidden", "not-found"),
        ),
    )
    async def revoke_token(
        self,
        request: Request,
        token_id: Annotated[
            str, Parameter(description="the token's id, as listed", pattern=TOKEN_ID_PATTERN)
        ],
    ) -> None:
        services, caller = await authenticated(request)
        await services.tenant_tokens.revoke(caller, token_id)
