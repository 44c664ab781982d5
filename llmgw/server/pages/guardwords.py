"""The Turkish of the guard page, kept apart from ``i18n.TURKISH`` (which takes them
in) so the words of this screen travel with it."""

from __future__ import annotations

TURKISH: dict[str, str] = {
    "Guard": "Koruma",
    (
        "A key's guard policies read its prompts, the arguments of its tool calls and "
        "the tools' answers: personal data redacted, blocked or flagged, instructions "
        "blocked or flagged."
    ): (
        "Bir anahtarın koruma politikaları istemlerini, araç çağrılarının argümanlarını "
        "ve araçların yanıtlarını okur: kişisel veri gizlenir, engellenir ya da "
        "işaretlenir; talimatlar engellenir ya da işaretlenir."
    ),
    "Policies": "Politikalar",
    "Policy": "Politika",
    "Judge": "Yargıç",
    "Instructions": "Talimatlar",
    "Personal data": "Kişisel veri",
    "Wait": "Bekleme",
    "Past the wait": "Bekleme aşılınca",
    "Since start": "Başlangıçtan beri",
    "pattern rules only": "yalnızca kalıp kuralları",
    "refuse": "reddet",
    "let through, flagged": "işaretleyip geçir",
    "No guard policy yet: a key reads and sends as it is.": (
        "Henüz koruma politikası yok: anahtarlar olduğu gibi okur ve gönderir."
    ),
    "Recent decisions": "Son kararlar",
    "Verdict": "Karar",
    "Where": "Nerede",
    "Found": "Bulunan",
    "No decision since this control plane started.": (
        "Bu denetim düzlemi başladığından beri karar yok."
    ),
    "Add a policy": "Politika ekle",
    (
        "A policy of the same name is replaced. Keys take it with "
        "`llmgw ctl keys limits KEY --guard NAME`."
    ): (
        "Aynı adlı politika değiştirilir. Anahtarlar onu "
        "`llmgw ctl keys limits KEY --guard NAME` ile alır."
    ),
    "Judge (a model of the catalog; blank: pattern rules only)": (
        "Yargıç (katalogdan bir model; boş: yalnızca kalıp kuralları)"
    ),
    "Wait (ms)": "Bekleme (ms)",
    "Add": "Ekle",
}
