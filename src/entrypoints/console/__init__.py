"""The console: a web page for people, served as three static files by one route.

The page needs no token to load; it asks for one and then reads everything through the public
HTTP API below `/api/workflow-streams` with the Bearer header, like any other client. No private
route serves it data. The files are plain HTML, CSS and JavaScript (no build step, nothing from
another origin), and the Content-Security-Policy allows nothing but this origin."""
