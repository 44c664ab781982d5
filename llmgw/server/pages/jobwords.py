"""The Turkish of a model page's serve job, kept apart from ``i18n.TURKISH`` (which
takes them in) so the words of this section travel with it."""

from __future__ import annotations

TURKISH: dict[str, str] = {
    "Serve job": "Sunma işi",
    "Fetched": "İndirilen",
    "Failed at {step}: {reason}": "{step} adımında başarısız oldu: {reason}",
    "Follow it with": "İzlemek için",
}
