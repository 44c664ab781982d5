"""The admin pages' words: English as written in the templates, Turkish from a catalogue.

Every string a page shows goes through ``_`` (``{{ _("Nodes") }}`` in a template,
``tr(...)`` in code); the English text is its own key. A test reads every template and
page module for those calls and checks each has a Turkish entry, so a page never shows
half of one language. The language is the ``llmgw_lang`` cookie (the switch in the
header), else the browser's ``Accept-Language``, else English.
"""

from __future__ import annotations

from collections.abc import Callable

from llmgw.server.pages import (
    explorewords,
    finetunewords,
    guardwords,
    jobwords,
    mcpwords,
    mirrorwords,
    peoplewords,
    signinwords,
    slurmwords,
)

LANGUAGES = {"en": "English", "tr": "Türkçe"}
LANG_COOKIE = "llmgw_lang"

Translate = Callable[..., str]

TURKISH: dict[str, str] = {
    # Frame and sign-in
    "llmgw admin": "llmgw yönetim",
    "Overview": "Genel bakış",
    "Nodes": "Düğümler",
    "Models": "Modeller",
    "Replicas": "Kopyalar",
    "GPU map": "GPU haritası",
    "Keys": "Anahtarlar",
    "Usage": "Kullanım",
    "Playground": "Deneme alanı",
    "Audit log": "Denetim kaydı",
    "Sign in": "Oturum aç",
    "Sign out": "Oturumu kapat",
    "Admin token": "Yönetici belirteci",
    "The admin token is in the data directory's admin.token file.": (
        "Yönetici belirteci veri dizinindeki admin.token dosyasındadır."
    ),
    "That token is not an admin token of this cluster.": (
        "Bu belirteç bu kümenin yönetici belirteci değil."
    ),
    "Too many failed sign-ins from your address; try again in {seconds} s.": (
        "Adresinizden çok fazla başarısız giriş; {seconds} sn sonra yeniden deneyin."
    ),
    # Sign-in with the company's directory (LDAP, Active Directory)
    "Login": "Kullanıcı adı",
    "Password": "Parola",
    "Or with the admin token, for setting up and recovering the cluster:": (
        "Ya da kümeyi kurmak ve kurtarmak için yönetici belirteciyle:"
    ),
    "Wrong login or password.": "Kullanıcı adı ya da parola yanlış.",
    "This account is deactivated; ask an admin.": ("Bu hesap devre dışı; bir yöneticiye başvurun."),
    "The directory cannot be asked now; try again later.": (
        "Dizin sunucusuna şu an ulaşılamıyor; daha sonra yeniden deneyin."
    ),
    "Signing in with a login and password is off.": (
        "Kullanıcı adı ve parolayla oturum açma kapalı."
    ),
    ("This control plane is a standby: sign in on the leader once, to make your account."): (
        "Bu denetim düzlemi yedek: hesabınızın açılması için bir kez liderde oturum açın."
    ),
    "Signed in as {actor} ({role})": "{actor} olarak oturum açık ({role})",
    "Updated {time}": "Güncellendi {time}",
    "The control plane has not answered since {time}.": (
        "Denetim düzlemi {time} zamanından beri yanıt vermiyor."
    ),
    "Language": "Dil",
    "This control plane is a standby: make changes on the leader, {leader}.": (
        "Bu denetim düzlemi yedek: değişiklikleri lider üzerinde yapın, {leader}."
    ),
    "The form token is missing or old; reload the page and send it again.": (
        "Oturumunuzun form belirteci eksik ya da eski; sayfayı yenileyip yeniden gönderin."
    ),
    "You may not do this: it needs the {role} role.": "Bunu yapamazsınız: {role} rolü gerekir.",
    (
        "This form was sent by another site's page ({origin}), not by this control plane's "
        "own ({site}); nothing was changed. Open the page at {site} and send it from there."
    ): (
        "Bu form bu denetim düzleminin kendi sayfasından ({site}) değil, başka bir sitenin "
        "sayfasından ({origin}) gönderildi; hiçbir şey değişmedi. Sayfayı {site} adresinde "
        "açıp oradan gönderin."
    ),
    "Not found": "Bulunamadı",
    # Sign-in through the cluster's identity provider (OIDC, Entra ID)
    "Sign in with {name}": "{name} ile oturum aç",
    "Signed in": "Oturum açıldı",
    "Signed in as {login}.": "{login} olarak oturum açıldı.",
    "Continue": "Devam et",
    "Sign-in through an identity provider is not set up on this cluster.": (
        "Bu kümede kimlik sağlayıcısı ile oturum açma ayarlanmamış."
    ),
    "The identity provider could not be reached; try again, or sign in with the admin token.": (
        "Kimlik sağlayıcısına ulaşılamadı; yeniden deneyin ya da yönetici belirteciyle oturum açın."
    ),
    "This sign-in was not started here, was already used, or took too long; start it again.": (
        "Bu oturum açma burada başlatılmadı, zaten kullanıldı ya da çok uzun sürdü; "
        "yeniden başlatın."
    ),
    "The identity provider did not sign you in; nothing was changed.": (
        "Kimlik sağlayıcısı oturumunuzu açmadı; hiçbir şey değişmedi."
    ),
    "The identity provider's answer did not check out; nothing was signed in.": (
        "Kimlik sağlayıcısının yanıtı doğrulanamadı; oturum açılmadı."
    ),
    "Your account on this cluster is deactivated; ask a cluster admin.": (
        "Bu kümedeki hesabınız devre dışı; bir küme yöneticisine başvurun."
    ),
    (
        "This control plane cannot record your sign-in now (a standby, or its store is down); "
        "sign in at the leader, or try again."
    ): (
        "Bu denetim düzlemi oturum açmanızı şu an kaydedemiyor (yedek ya da deposu çalışmıyor); "
        "liderde oturum açın ya da yeniden deneyin."
    ),
    "The identity provider named no user name or e-mail address for you.": (
        "Kimlik sağlayıcısı sizin için bir kullanıcı adı ya da e-posta adresi bildirmedi."
    ),
    # Overview
    "Serving": "Hizmette",
    "Stopped": "Durduruldu",
    "/v1 answers clients.": "/v1 istemcilere yanıt veriyor.",
    "/v1 refuses every request (llmgw stop).": "/v1 her isteği reddediyor (llmgw stop).",
    "Stop serving": "Hizmeti durdur",
    "Start serving": "Hizmeti başlat",
    "Nodes by state": "Duruma göre düğümler",
    "Cards by model": "Modele göre kartlar",
    "Cards": "Kartlar",
    "Mean busy": "Ortalama meşguliyet",
    "Mean memory": "Ortalama bellek",
    "Models and replicas": "Modeller ve kopyalar",
    "Alerts": "Uyarılar",
    "No alerts.": "Uyarı yok.",
    "Gateway": "Ağ geçidi",
    "Requests": "İstekler",
    "Errors": "Hatalar",
    "Time to first token": "İlk belirtece kadar süre",
    "none": "yok",
    # Nodes
    "Node": "Düğüm",
    "State": "Durum",
    "CPU": "CPU",
    "RAM": "RAM",
    "Engines": "Motorlar",
    "Warnings": "Uyarılar",
    "Filter": "Süz",
    "name, state, label or card": "ad, durum, etiket ya da kart",
    "No node matches.": "Eşleşen düğüm yok.",
    "No nodes yet: add one with `llmgw node add`.": (
        "Henüz düğüm yok: `llmgw node add` ile ekleyin."
    ),
    "{n} of {total} nodes": "{n} / {total} düğüm",
    "Host": "Ana makine",
    "Operating system": "İşletim sistemi",
    "Kernel": "Çekirdek",
    "CPU model": "CPU modeli",
    "Logical CPUs": "Mantıksal CPU",
    "Memory": "Bellek",
    "Address": "Adres",
    "Agent version": "Ajan sürümü",
    "Last seen": "Son görülme",
    "Disks": "Diskler",
    "Path": "Yol",
    "Free": "Boş",
    "Total": "Toplam",
    "Shards": "Parçalar",
    "Replica": "Kopya",
    "Model": "Model",
    "Port": "Bağlantı noktası",
    "Card": "Kart",
    "Busy": "Meşgul",
    "Temperature": "Sıcaklık",
    "Power": "Güç",
    "The last hour": "Son bir saat",
    "Labels": "Etiketler",
    "Cordon": "Kordon",
    "Uncordon": "Kordonu kaldır",
    "Drain": "Boşalt",
    "Stop draining": "Boşaltmayı durdur",
    "Save labels": "Etiketleri kaydet",
    "key=value, one a line": "anahtar=değer, satır başına bir",
    "cordoned": "kordonlu",
    "draining": "boşaltılıyor",
    "not read": "okunmadı",
    "Not live: the last figures read": "Canlı değil: en son okunan değerler",
    "read at an unknown time": "ne zaman okunduğu bilinmiyor",
    "read {seconds} s ago": "{seconds} sn önce okundu",
    "Log": "Günlük",
    "No shards.": "Parça yok.",
    "No cards.": "Kart yok.",
    # Models
    "Profiles": "Profiller",
    "Ready": "Hazır",
    "Wanted": "İstenen",
    "Source": "Kaynak",
    "Engine": "Motor",
    "Context": "Bağlam",
    "Stop": "Durdur",
    "Start": "Başlat",
    "Restart": "Yeniden başlat",
    "No models yet: serve one with `llmgw ctl model serve`.": (
        "Henüz model yok: `llmgw ctl model serve` ile bir model sunun."
    ),
    "Explain": "Açıkla",
    "Each node's verdict": "Her düğümün kararı",
    "One replica spans this many nodes": "Bir kopyanın yayıldığı düğüm sayısı",
    "Sets of nodes, best first": "Düğüm kümeleri, en iyisi önce",
    "Set of nodes": "Düğüm kümesi",
    # Keys
    "Name": "Ad",
    "Allowed models": "İzin verilen modeller",
    "all": "hepsi",
    "Requests a minute": "Dakikada istek",
    "Tokens a minute": "Dakikada belirteç",
    "Monthly token budget": "Aylık belirteç bütçesi",
    "Expires": "Bitiş",
    "Created": "Oluşturuldu",
    "Create key": "Anahtar oluştur",
    "Revoke": "İptal et",
    "active": "etkin",
    "revoked": "iptal edildi",
    "expired": "süresi doldu",
    "The new key, shown this once:": "Yeni anahtar, yalnızca bu kez gösterilir:",
    "Copy": "Kopyala",
    "Copied": "Kopyalandı",
    "model patterns, comma-separated (qwen*)": "model kalıpları, virgülle ayrılmış (qwen*)",
    "No keys yet.": "Henüz anahtar yok.",
    "Tokens this month": "Bu ay belirteç",
    # Audit
    "When": "Ne zaman",
    "Who": "Kim",
    "Action": "Eylem",
    "Target": "Hedef",
    "Detail": "Ayrıntı",
    "Nothing recorded yet.": "Henüz kayıt yok.",
    "Replicas by state": "Duruma göre kopyalar",
    # Serve, estimate, scale, replicas
    "Cards per replica": "Kopya başına kart",
    "Estimate": "Tahmin",
    "Serve": "Sun",
    "Scale": "Ölçekle",
    "Memory per replica": "Kopya başına bellek",
    "Memory per card": "Kart başına bellek",
    "weights": "ağırlıklar",
    "KV cache": "KV önbelleği",
    "On the CPU": "CPU üzerinde",
    "Fits on": "Sığdığı yerler",
    "no node": "hiçbir düğüm",
    "Fits": "Sığar",
    "Longest context": "En uzun bağlam",
    "CPU tokens/s": "CPU belirteç/sn",
    "Compute": "Hesaplama",
    "Download": "İndirme",
    "layers offloaded": "katman aktarıldı",
    # GPU map and logs
    "Colour by": "Renklendirme",
    "work": "iş",
    "busy": "meşgul",
    "memory": "bellek",
    "temperature": "sıcaklık",
    "power": "güç",
    "Work: the share of time SMs were active where the profiling counters are read, else busy.": (
        "İş: profil sayaçları okunabiliyorsa SM'lerin etkin olduğu zamanın payı, yoksa meşguliyet."
    ),
    "Busy: the share of time any kernel ran (utilization.gpu), not how much of the card it used.": (
        "Meşgul: herhangi bir çekirdeğin çalıştığı zamanın payı (utilization.gpu); kartın "
        "ne kadarının kullanıldığı değil."
    ),
    "Memory: card memory in use over the card's total.": (
        "Bellek: kullanılan kart belleğinin toplama oranı."
    ),
    "Temperature: from 30 °C (pale) to 90 °C (dark).": (
        "Sıcaklık: 30 °C (açık) ile 90 °C (koyu) arası."
    ),
    "Power: draw over the enforced limit.": "Güç: çekilen gücün uygulanan sınıra oranı.",
    "Show": "Göster",
    # Playground
    "The playground needs JavaScript: it talks to /v1 from the browser, as a client would.": (
        "Deneme alanı JavaScript ister: /v1 ile tarayıcıdan, bir istemci gibi konuşur."
    ),
    "Reading the models this key may use…": "Bu anahtarın kullanabildiği modeller okunuyor…",
    "This key may use no model.": "Bu anahtar hiçbir modeli kullanamaz.",
    "Models this key may use: {n}.": "Bu anahtarın kullanabildiği modeller: {n}.",
    "Paste a gateway key first.": "Önce bir ağ geçidi anahtarı yapıştırın.",
    "The gateway answered: {message}": "Ağ geçidinin yanıtı: {message}",
    "The gateway could not be reached: {message}": "Ağ geçidine ulaşılamadı: {message}",
    "Answering…": "Yanıtlanıyor…",
    "Stopped.": "Durduruldu.",
    "Done.": "Bitti.",
    "You": "Siz",
    "Assistant": "Asistan",
    "Gateway key": "Ağ geçidi anahtarı",
    "Use this key": "Bu anahtarı kullan",
    "Most tokens": "En çok belirteç",
    (
        "The key stays in this page's memory: it goes only to /v1, as a client's would, "
        "and is never stored."
    ): (
        "Anahtar yalnızca bu sayfanın belleğinde durur: bir istemcininki gibi yalnızca "
        "/v1'e gider ve hiç saklanmaz."
    ),
    "Write a message; Ctrl+Enter sends it": "Bir ileti yazın; Ctrl+Enter gönderir",
    "Send": "Gönder",
    "Clear": "Temizle",
    "Prompt tokens": "İstem belirteçleri",
    "Completion tokens": "Yanıt belirteçleri",
    "Tokens a second": "Saniyede belirteç",
    # Usage
    "All models": "Tüm modeller",
    "By": "Gruplama",
    "Day": "Gün",
    "Download CSV": "CSV indir",
    "From": "Başlangıç",
    "From {first} to {last}, both included (UTC days).": (
        "{first} ile {last} arası, ikisi de dahil (UTC günleri)."
    ),
    "Key": "Anahtar",
    "No usage in these days.": "Bu günlerde kullanım yok.",
    "The chart needs JavaScript; the table below has the same figures.": (
        "Grafik JavaScript gerektirir; aşağıdaki tablo aynı rakamları gösterir."
    ),
    "To": "Bitiş",
    "Tokens per day": "Günlük belirteç",
    "Total tokens": "Toplam belirteç",
    # Removing a model
    "Type the model's name to remove it": "Kaldırmak için modelin adını yazın",
    "Also delete its files on the nodes": "Düğümlerdeki dosyalarını da sil",
    "Remove": "Kaldır",
    "Longest answer": "En uzun yanıt",
    "The gateway's last hour": "Ağ geçidinin son bir saati",
    # Fabrics
    "Fabrics": "Ağ dokuları",
    "Fabric": "Ağ dokusu",
    "No InfiniBand fabric: no node reports an InfiniBand port whose master subnet manager "
    "was read.": (
        "InfiniBand ağ dokusu yok: hiçbir düğüm, ana alt ağ yöneticisi okunmuş bir "
        "InfiniBand bağlantı noktası bildirmiyor."
    ),
    "Master SM": "Ana SM",
    "Ports disagree on the master SM:": "Bağlantı noktaları ana SM konusunda uyuşmuyor:",
    "Other SMs seen": "Görülen diğer SM'ler",
    "Ports": "Bağlantı noktaları",
    "Active rates": "Etkin hızlar",
    "{n} at {rate} Gb/s": "{n} adet {rate} Gb/s hızında",
    "none active": "etkin olan yok",
    "{n} rate not read": "{n} tanesinin hızı okunmadı",
    "Subnet managers the fabric knows": "Ağ dokusunun bildiği alt ağ yöneticileri",
    "Priority": "Öncelik",
    "Activity": "Etkinlik",
    "Problems": "Sorunlar",
    "No problems.": "Sorun yok.",
    "Fix:": "Çözüm:",
    "Map": "Harita",
    "Read {age} ago by {node}": "{age} önce {node} tarafından okundu",
    "{switches} switches · {adapters} adapters on {hosts} hosts · {cables} cables": (
        "{switches} anahtar · {hosts} sunucuda {adapters} bağdaştırıcı · {cables} kablo"
    ),
    "{n} degraded": "{n} tanesi düşük hızda",
    "{n} off their rail": "{n} tanesi kendi rayının dışında",
    "The last read failed: {error}": "Son okuma başarısız oldu: {error}",
    "cables to other switches": "diğer anahtarlara giden kablolar",
    "degraded": "düşük hızda",
    "off its rail": "rayının dışında",
    "core": "çekirdek",
    "spine": "omurga",
    "leaf": "yaprak",
    "no tier": "katmansız",
    "rate not read": "hız okunmadı",
    "{host} {adapter} is on {leaf} port {port}, which carries {rail}; its rail is on {expected}": (
        "{host} {adapter}, {rail} rayını taşıyan {leaf} anahtarının {port} numaralı bağlantı "
        "noktasında; kendi rayı {expected} üzerinde"
    ),
    "No map yet: {why}": "Henüz harita yok: {why}",
    "none has been read yet": "henüz hiçbiri okunmadı",
    "RoCE networks": "RoCE ağları",
    "Network": "Ağ",
    "None seen.": "Hiç görülmedi.",
    "Ports of no fabric": "Hiçbir ağ dokusuna ait olmayan bağlantı noktaları",
    "Active InfiniBand ports whose master SM could not be read.": (
        "Ana SM'si okunamayan etkin InfiniBand bağlantı noktaları."
    ),
    "Rate": "Hız",
    "None.": "Yok.",
    # NVLink racks
    "NVLink racks": "NVLink kabinleri",
    "No NVLink domain: no node reports a card with an NVLink fabric (GB200 NVL72 and alike).": (
        "NVLink alanı yok: hiçbir düğüm NVLink dokusu olan bir kart bildirmiyor (GB200 "
        "NVL72 ve benzerleri)."
    ),
    "joined": "katıldı",
    "joined, not Healthy": "katıldı, sağlıklı değil",
    "not joined": "katılmadı",
    "Domain": "Alan",
    "clique {id}": "klik {id}",
    "{trays} trays · {cards} cards: {joined} joined": (
        "{trays} tepsi · {cards} kart: {joined} tanesi katıldı"
    ),
    "{n} not joined": "{n} tanesi katılmadı",
    "{n} not read": "{n} tanesi okunmadı",
    "IMEX up on {n}": "IMEX {n} tepside çalışıyor",
    "down on {n}": "{n} tepside çalışmıyor",
    "not read on {n}": "{n} tepside okunmadı",
    "Tray": "Tepsi",
    "Notes": "Notlar",
    "card {index}": "kart {index}",
    "up": "çalışıyor",
    "down": "çalışmıyor",
    "{n} channel(s)": "{n} kanal",
    "card {index} not joined: {state}": "kart {index} katılmadı: {state}",
    "card {index}: state not read": "kart {index}: durumu okunmadı",
    "agent not connected: last figures": "ajan bağlı değil: son değerler",
    "Unjoined cards": "Katılmamış kartlar",
    "Cards with an NVLink fabric in no domain.": (
        "NVLink dokusu olup hiçbir alanda olmayan kartlar."
    ),
    # llmgw login's device page
    "Sign in ctl": "ctl oturumu aç",
    "Approved: go back to your terminal, where ctl is now signed in as you.": (
        "Onaylandı: terminalinize dönün, ctl artık sizin adınıza oturum açtı."
    ),
    "Denied: that ctl was not signed in.": "Reddedildi: o ctl oturum açmadı.",
    "{client} at {address} asks to act as you, with a personal token.": (
        "{address} adresindeki {client}, kişisel bir belirteçle sizin adınıza işlem yapmak istiyor."
    ),
    "Approve only if your terminal shows this code:": (
        "Yalnızca terminalinizde bu kod görünüyorsa onaylayın:"
    ),
    "Approve": "Onayla",
    "Deny": "Reddet",
    "The code ctl shows": "ctl'nin gösterdiği kod",
    "Next": "İleri",
}

TURKISH.update(peoplewords.TURKISH)
TURKISH.update(signinwords.TURKISH)
TURKISH.update(slurmwords.TURKISH)
TURKISH.update(mirrorwords.TURKISH)
TURKISH.update(mcpwords.TURKISH)
TURKISH.update(guardwords.TURKISH)
TURKISH.update(jobwords.TURKISH)
TURKISH.update(explorewords.TURKISH)
TURKISH.update(finetunewords.TURKISH)
CATALOGUES: dict[str, dict[str, str]] = {"en": {}, "tr": TURKISH}


def pick(cookie: str | None, accept_language: str) -> str:
    """The language to answer in: the switch's cookie, the browser's first known
    language, or English."""
    if cookie in LANGUAGES:
        return str(cookie)
    for item in accept_language.split(","):
        code = item.split(";")[0].strip().lower()[:2]
        if code in LANGUAGES:
            return code
    return "en"


def translator(lang: str) -> Translate:
    """``_(text, **values)``: ``text`` in ``lang``, its ``{names}`` filled in."""
    catalogue = CATALOGUES.get(lang, {})

    def translate(text: str, **values: object) -> str:
        said = catalogue.get(text, text)
        return said.format(**values) if values else said

    return translate
