"""The Turkish of the People, Organisations and key-ownership words of the pages, kept
apart from ``i18n.TURKISH`` (which takes them in) so the words of these screens travel
with them."""

from __future__ import annotations

TURKISH: dict[str, str] = {
    "People": "Kişiler",
    "Person": "Kişi",
    "Organisations": "Kuruluşlar",
    "Organisation": "Kuruluş",
    "Teams": "Ekipler",
    "Team": "Ekip",
    "Projects": "Projeler",
    "Project": "Proje",
    "Members": "Üyeler",
    "Memberships": "Üyelikler",
    "Role": "Rol",
    "Cluster role": "Küme rolü",
    "Login": "Kullanıcı adı",
    "login": "giriş adı",
    "Full name": "Ad soyad",
    "E-mail": "E-posta",
    "Of": "Nerede",
    "All": "Tümü",
    "Save": "Kaydet",
    "Change": "Değiştir",
    "Activate": "Etkinleştir",
    "Deactivate": "Devre dışı bırak",
    "Deactivating ends their sessions and personal tokens at once, on every control plane.": (
        "Devre dışı bırakmak kişinin oturumlarını ve kişisel belirteçlerini her denetim "
        "düzleminde hemen sonlandırır."
    ),
    "deactivated": "devre dışı",
    "Add person": "Kişi ekle",
    "Add organisation": "Kuruluş ekle",
    "Add team": "Ekip ekle",
    "Add project": "Proje ekle",
    "Set member": "Üyeyi ayarla",
    "Belongs to": "Sahibi",
    "Personal tokens": "Kişisel belirteçler",
    "Make token": "Belirteç oluştur",
    "What it is for": "Ne için",
    "Days it lasts": "Geçerli gün sayısı",
    "The new token, shown this once:": "Yeni belirteç, yalnızca bu kez gösteriliyor:",
    "in {days} d": "{days} gün sonra",
    "No people yet.": "Henüz kimse yok.",
    "No memberships.": "Üyelik yok.",
    "No personal tokens.": "Kişisel belirteç yok.",
    "No teams yet.": "Henüz ekip yok.",
    "No projects yet.": "Henüz proje yok.",
    "No members you may see.": "Görebileceğiniz üye yok.",
    "You belong to no organisation yet: an admin of one adds you.": (
        "Henüz hiçbir kuruluşa üye değilsiniz: bir kuruluşun yöneticisi sizi ekler."
    ),
    "Usage of {org}": "{org} kullanımı",
    "by hand": "elle",
    "set by hand: groups never lower it": "elle ayarlandı: gruplar bunu asla düşürmez",
    "none: memberships only": "yok: yalnızca üyelikler",
    "member": "üye",
    "organisation": "kuruluş",
    "team": "ekip",
    "team {name}": "{name} ekibi",
    "you": "siz",
}
