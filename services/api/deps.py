"""Dependencies shared by the routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from services.serving.gateway import Gateway


async def get_gateway(request: Request) -> Gateway:
    """The app's gateway. ``async`` so FastAPI calls it on the event loop: a plain ``def``
    dependency is sent through the thread pool on every request."""
    gateway: Gateway = request.app.state.gateway
    return gateway


GatewayDep = Annotated[Gateway, Depends(get_gateway)]
