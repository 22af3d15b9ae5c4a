"""heddle-server: the engine over HTTP, for programs that run agents for other programs.

`heddle.server.service.Service` holds what a server runs; `heddle.server.app.build_app` makes
its ASGI application; `heddle.server.serve.serve` opens the port and drains on a signal.
"""
