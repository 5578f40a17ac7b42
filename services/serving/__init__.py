"""The request path: the gateway, the stage contract (``context``) and the stage runner
(``recommender``), the served release, routing between versions, business rules and the
request-time features."""
