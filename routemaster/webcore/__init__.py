"""The web core: what both web faces (the API and the console) are made of, and neither owns.

Each endpoint's declaration (scope, replies, inputs: ``endpoints.py``) and
the request checks made from it (``validation.py``, with the schemas of
``schemas.py``), routing on raw paths (``paths.py``), reaching the App
(``extension.py``), bodies within the limits (``bodies.py``), JSON answers
and errors (``responses.py``, ``errors.py``). It imports the service and
what lies below it, never a face: the faces import it.
"""
