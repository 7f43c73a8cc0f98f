"""The HTTP API, one of the two web faces (the console is the other).

Each handler parses its request, calls the service (:mod:`routemaster.service`)
and renders the answer as JSON; none imports the store or opens a
transaction. The Flask application serving both faces is assembled by
:func:`routemaster.web.create_app`.
"""
