"""Dependencies shared by the routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from services.gateway import Gateway


def get_gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


GatewayDep = Annotated[Gateway, Depends(get_gateway)]
