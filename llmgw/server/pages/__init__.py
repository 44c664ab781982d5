"""The admin pages (``/admin``): Jinja2 templates, htmx and uPlot, over the same services
as the admin API. ``site.routes`` builds them; ``frame`` holds what every page goes
through; ``session`` signs sessions and CSRF tokens; ``i18n`` holds their words."""
