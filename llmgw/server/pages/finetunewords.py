"""The Turkish of the fine-tunes pages, kept apart from ``i18n.TURKISH`` (which takes
them in) so the words of these screens travel with them."""

from __future__ import annotations

TURKISH: dict[str, str] = {
    "Fine-tunes": "İnce ayarlar",
    "Fine-tune": "İnce ayar",
    (
        "A LoRA adapter of a model, trained on your prompt and completion pairs on a node "
        "with the memory free, then served beside the model as MODEL:NAME."
    ): (
        "Bir modelin LoRA bağdaştırıcısı: istem ve tamamlama çiftlerinizle, belleği boş "
        "bir düğümde eğitilir, sonra modelin yanında MODEL:AD olarak sunulur."
    ),
    "Adapter": "Bağdaştırıcı",
    "Loss": "Kayıp",
    "No fine-tune yet.": "Henüz ince ayar yok.",
    "Start a fine-tune": "İnce ayar başlat",
    (
        "Paste the pairs, one JSON object a line, with a prompt and a completion (or the "
        "messages of a chat). The form takes up to 64 KiB; larger files go through "
        "`llmgw ctl finetune create --data FILE`."
    ): (
        "Çiftleri yapıştırın, satır başına bir JSON nesnesi, bir istem ve bir tamamlama "
        "ile (ya da bir sohbetin iletileri). Form en çok 64 KiB alır; daha büyük dosyalar "
        "`llmgw ctl finetune create --data FILE` ile gönderilir."
    ),
    "Adapter name": "Bağdaştırıcı adı",
    "Pairs (JSONL)": "Çiftler (JSONL)",
    "Node (blank: one with the memory free)": "Düğüm (boş: belleği boş olan biri)",
    "Memory (MiB)": "Bellek (MiB)",
    "Epochs": "Devir",
    "Rank": "Mertebe",
    "Base weights (HF safetensors; blank: the model's own source)": (
        "Temel ağırlıklar (HF safetensors; boş: modelin kendi kaynağı)"
    ),
    "Base weights": "Temel ağırlıklar",
    "Pairs": "Çiftler",
    "Peak memory": "En yüksek bellek",
    "Adapter size": "Bağdaştırıcı boyutu",
    "Updated": "Güncellendi",
    "Loss by step": "Adım adım kayıp",
    "{n} steps: from {first} to {last}.": "{n} adım: {first} değerinden {last} değerine.",
    "No loss yet: it shows once two steps have run.": (
        "Henüz kayıp yok: iki adım çalıştıktan sonra görünür."
    ),
    "Serve it: `llmgw ctl model adapter add {model} {name}`, then ask for {model}:{name}.": (
        "Sunmak için: `llmgw ctl model adapter add {model} {name}`, sonra {model}:{name} isteyin."
    ),
    "Refresh": "Yenile",
    "Cancel": "İptal et",
    "All fine-tunes": "Tüm ince ayarlar",
}
