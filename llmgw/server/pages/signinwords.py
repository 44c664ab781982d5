"""The Turkish of the Sign-in page's words, kept apart from ``i18n.TURKISH`` (which
takes them in) so the words of this screen travel with it."""

from __future__ import annotations

TURKISH: dict[str, str] = {
    "Sign-in": "Oturum açma",
    "on": "açık",
    "off": "kapalı",
    "set": "ayarlı",
    "Settings are set with `llmgw ctl auth`; secrets are never shown here.": (
        "Ayarlar `llmgw ctl auth` ile yapılır; gizli bilgiler burada asla gösterilmez."
    ),
    "Last changed {time} UTC ({ago} ago) by {actor}": (
        "Son değişiklik {time} UTC ({ago} önce), {actor} tarafından"
    ),
    "No change in the audit log.": "Denetim kaydında değişiklik yok.",
    "Group": "Grup",
    "Groups": "Gruplar",
    "Gives": "Verdiği",
    "No group maps: groups give nothing.": "Grup eşlemesi yok: gruplar hiçbir şey vermez.",
    "Turn off": "Kapat",
    "OpenID Connect / Entra ID": "OpenID Connect / Entra ID",
    "Kind": "Tür",
    "Issuer": "Yayıncı",
    "Client id": "İstemci kimliği",
    "Client secret": "İstemci gizli anahtarı",
    "Groups claim": "Grup beyanı",
    "Scopes": "Kapsamlar",
    "Button": "Düğme",
    "LDAP / Active Directory": "LDAP / Active Directory",
    "Service account": "Hizmet hesabı",
    "People under": "Kişilerin yeri",
    "Groups under": "Grupların yeri",
    "CA": "Sertifika yetkilisi",
    "Try a sign-in": "Oturum açmayı dene",
    "optional: tries their bind too": "isteğe bağlı: kişinin bağlanmasını da dener",
    "Try": "Dene",
    "Every step passed.": "Her adım geçti.",
    "Failed at {step}: {message}": "{step} adımında başarısız: {message}",
    "Step": "Adım",
    "SCIM provisioning": "SCIM ile hesap sağlama",
    "Endpoint": "Uç nokta",
    "Token": "Belirteç",
    "made {time} UTC": "{time} UTC'de oluşturuldu",
    "People and groups": "Kişiler ve gruplar",
    "{users} people, {groups} groups": "{users} kişi, {groups} grup",
    "The identity provider's new token, shown this once (the one before has ended):": (
        "Kimlik sağlayıcının yeni belirteci, yalnızca bu kez gösteriliyor (öncekinin süresi bitti):"
    ),
    "Make a new token": "Yeni belirteç oluştur",
    "Turn on: make a token": "Aç: belirteç oluştur",
    "Group maps": "Grup eşlemeleri",
    "One a line: GROUP=ORG[/TEAM]:ROLE or GROUP=cluster:ROLE": (
        "Satır başına bir tane: GRUP=KURULUŞ[/EKİP]:ROL veya GRUP=cluster:ROL"
    ),
    "Sign-in settings": "Oturum açma ayarları",
}
