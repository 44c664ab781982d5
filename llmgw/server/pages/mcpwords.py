"""The Turkish of the MCP page, kept apart from ``i18n.TURKISH`` (which takes them in)
so the words of this screen travel with it."""

from __future__ import annotations

TURKISH: dict[str, str] = {
    "MCP": "MCP",
    "MCP tool servers": "MCP araç sunucuları",
    (
        "An agent reaches these servers' tools through the gateway's /mcp, each named "
        "SERVER.TOOL; a key reaches only the tools it is granted."
    ): (
        "Bir ajan bu sunucuların araçlarına ağ geçidinin /mcp yolundan ulaşır, her biri "
        "SUNUCU.ARAÇ adıyla; bir anahtar yalnızca kendisine verilen araçlara ulaşır."
    ),
    "Test of {name}": "{name} sınaması",
    "Answered in {ms} ms with {n} tools.": "{ms} ms içinde {n} araçla yanıt verdi.",
    "Failed ({failure}): {message}": "Başarısız ({failure}): {message}",
    "Server": "Sunucu",
    "Headers": "Başlıklar",
    "Timeout": "Zaman aşımı",
    "Tools": "Araçlar",
    "Granted to": "Verilenler",
    "out until {time} UTC": "{time} UTC'ye dek devre dışı",
    "in the control plane": "denetim düzleminde",
    "sealed": "mühürlü",
    "{n}/min per caller": "arayan başına {n}/dk",
    "not listed yet": "henüz listelenmedi",
    "no one": "kimse",
    "closed: {levels}": "kapalı: {levels}",
    "Test": "Sına",
    "Turn on": "Aç",
    "Add a server": "Sunucu ekle",
    "Address (streamable HTTP)": "Adres (akışlı HTTP)",
    "Bearer token (kept sealed)": "Taşıyıcı belirteç (mühürlü saklanır)",
    "Or credential headers, one 'Header-Name: value' a line (kept sealed)": (
        "Ya da kimlik başlıkları, her satıra bir 'Başlık-Adı: değer' (mühürlü saklanır)"
    ),
    "Plain headers, one NAME=VALUE a line": "Düz başlıklar, her satıra bir AD=DEĞER",
    "Timeout (s)": "Zaman aşımı (sn)",
    "Calls a minute per caller": "Arayan başına dakikada çağrı",
    "Description": "Açıklama",
    "Point an agent at /mcp": "Bir ajanı /mcp'ye yöneltin",
    (
        "Each person uses a key of their own (Keys), granted the tools it needs: "
        "`llmgw ctl keys limits KEY --tools SERVER.*`. An MCP client then takes this "
        "address, with the key as its bearer token:"
    ): (
        "Herkes kendi anahtarını (Anahtarlar) kullanır ve ona gereken araçlar verilir: "
        "`llmgw ctl keys limits KEY --tools SERVER.*`. Bir MCP istemcisi sonra bu adresi, "
        "anahtarı taşıyıcı belirteç olarak alır:"
    ),
}
