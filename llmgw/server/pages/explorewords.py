"""The Turkish of the Explore pages, kept apart from ``i18n.TURKISH`` (which takes them
in) so the words of these screens travel with them."""

from __future__ import annotations

TURKISH: dict[str, str] = {
    "Explore": "Keşfet",
    "Search": "Ara",
    "Sort": "Sırala",
    "trending": "gündemdeki",
    "likes": "beğeni",
    "downloads": "indirme",
    "Only what fits": "Yalnızca sığanlar",
    "Show": "Göster",
    "Judged by the nodes as they are now ({n}):": (
        "Düğümlerin şu anki durumuna göre değerlendirildi ({n}):"
    ),
    "largest card {name} ({memory}) on {node}": "en büyük kart {name} ({memory}), {node} üzerinde",
    "compute capability {cc}": "hesaplama yeteneği {cc}",
    "no cards": "kart yok",
    "most RAM on one node {memory} ({node})": "tek düğümde en çok RAM {memory} ({node})",
    "no node has said its memory": "hiçbir düğüm belleğini bildirmedi",
    "No KV cache is counted: the hub does not list a model's layers.": (
        "KV önbelleği hesaba katılmadı: hub bir modelin katmanlarını listelemiyor."
    ),
    "{shown} of {listed} repositories from {hub}.": (
        "{hub} kaynağından {listed} deponun {shown} tanesi."
    ),
    "No node has a card: GGUF repositories only.": (
        "Hiçbir düğümde kart yok: yalnızca GGUF depoları."
    ),
    "Parameters": "Parametreler",
    "Judged at": "Değerlendirilen",
    "Likes": "Beğeniler",
    "{n} card(s) on {node}": "{node} üzerinde {n} kart",
    "CPU on {node}": "{node} üzerinde CPU",
    "{tps} tokens/s": "{tps} token/sn",
    "speed not measured": "hız ölçülmedi",
    "fits {n} nodes": "{n} düğüme sığar",
    "fits no node": "hiçbir düğüme sığmaz",
    "needs {needs}": "{needs} gerekir",
    "best node {node}: cards {cards} free, RAM {ram}": (
        "en iyi düğüm {node}: kartlarda {cards} boş, RAM {ram}"
    ),
    "{p} B parameters": "{p} milyar parametre",
    "trained context {n} tokens": "eğitim bağlamı {n} token",
    "File set": "Dosya kümesi",
}
