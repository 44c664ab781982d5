"""The Turkish of the mirror page, kept apart from ``i18n.TURKISH`` (which takes them
in) so the words of this screen travel with it."""

from __future__ import annotations

TURKISH: dict[str, str] = {
    "Mirror": "Yansı",
    (
        "The mirror is off: set offline.mirror in server.yaml and import a bundle with "
        "`llmgw bundle import` (docs/offline.md)."
    ): (
        "Yansı kapalı: server.yaml'da offline.mirror'ı açın ve `llmgw bundle import` ile "
        "bir paket içe aktarın (docs/offline.md)."
    ),
    "The mirror holds nothing yet: import a bundle with `llmgw bundle import`.": (
        "Yansıda henüz bir şey yok: `llmgw bundle import` ile bir paket içe aktarın."
    ),
    (
        "Served to the nodes at /mirror/ on this control plane, {size} in all; every file "
        "was checked when imported."
    ): (
        "Düğümlere bu denetim düzleminin /mirror/ yolundan sunulur, toplam {size}; her "
        "dosya içe aktarılırken denetlendi."
    ),
    "Repository": "Depo",
    "Format": "Biçim",
    "Size": "Boyut",
    "Files": "Dosyalar",
    "Pickled weights only: llmgw refuses them unless the model allows pickles.": (
        "Yalnızca pickle ağırlıklar: model pickle'a izin vermedikçe llmgw bunları reddeder."
    ),
    (
        "where the internet is, take the repository's safetensors (the hub's SFconvertbot "
        "pull request, revision refs/pr/N) or convert the weights to safetensors, then "
        "bundle that repository."
    ): (
        "internetin olduğu yerde deponun safetensors sürümünü alın (hub'daki SFconvertbot "
        "çekme isteği, refs/pr/N sürümü) ya da ağırlıkları safetensors'a dönüştürün, sonra "
        "o depoyu paketleyin."
    ),
    "(size checked; the hub lists no sha256)": "(boyutu denetlendi; hub sha256 vermiyor)",
    "Engines and llmgw releases": "Motorlar ve llmgw sürümleri",
    "Release": "Sürüm",
    "File": "Dosya",
    "Mirrors on nodes": "Düğümlerdeki yansılar",
    "Order": "Sıra",
    "asked {ago} ago": "{ago} önce soruldu",
    "Answers": "Yanıt veriyor",
    "first": "ilk",
    "peer": "eş",
    "not asked yet": "henüz sorulmadı",
    "yes": "evet",
    "no": "hayır",
}
