"""The Turkish of the Slurm page and of Slurm on a node's page, kept apart from
``i18n.TURKISH`` (which takes them in) so the words of these screens travel with them."""

from __future__ import annotations

TURKISH: dict[str, str] = {
    "Slurm": "Slurm",
    "Controller": "Denetleyici",
    "Partition": "Bölüm",
    "Files under": "Dosyaların yeri",
    "the system's paths": "sistemin kendi yolları",
    "Slurm is off: `llmgw ctl slurm setup` turns it on.": (
        "Slurm kapalı: `llmgw ctl slurm setup` onu açar."
    ),
    "Part": "Görev",
    "Stage": "Aşama",
    "Slurm state": "Slurm durumu",
    "Reason": "Neden",
    "Jobs": "İşler",
    "Version": "Sürüm",
    "Waiting for": "Beklenen",
    "agent away": "ajan bağlı değil",
    "serving": "llmgw'de hizmette",
    "lending": "Slurm'e veriliyor",
    "lent": "Slurm'de",
    "reclaiming": "geri alınıyor",
    "Drained by a Slurm administrator: llmgw never resumes or overwrites it.": (
        "Bir Slurm yöneticisi boşalttı: llmgw bunu asla sürdürmez ya da değiştirmez."
    ),
    "ends {time} UTC": "bitişi {time} UTC",
    "Lend": "Slurm'e ver",
    "Reclaim": "Geri al",
    "Lend to Slurm": "Slurm'e ver",
    "Reclaim from Slurm": "Slurm'den geri al",
    "No node in Slurm's set.": "Slurm kümesinde düğüm yok.",
    "Lending by policy": "Kurala göre verme",
    "Lend a node idle for": "Boşta kalınca verme süresi",
    "{minutes} min": "{minutes} dk",
    "Cards kept for llmgw": "llmgw'ye ayrılan kartlar",
    "Reclaim when requests wait": "İstekler bu kadar bekleyince geri al",
    "nothing to do": "yapılacak bir şey yok",
    "Off: `llmgw ctl slurm policy` sets it.": "Kapalı: `llmgw ctl slurm policy` onu ayarlar.",
    "The files the control plane writes for slurmctld": (
        "Denetim düzleminin slurmctld için yazdığı dosyalar"
    ),
}
