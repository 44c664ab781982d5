"""LoRA adapters by name: one namespace with the models, and how a name is read.

A model's adapters (``Model.adapters``) are loaded by each of its replicas, unapplied;
a request applies one by naming it, as ``MODEL:ADAPTER`` or as the adapter's own name.
So an adapter's name is a name clients ask for, like a model's: no adapter may take a
model's name or another adapter's (of any model), and no model may take an adapter's.
``model.check_adapters`` judges a model's adapters on their own; this module judges
them against the rest of the catalog, and finds the model and adapter a name means.
Nothing here does IO.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from llmgw.server.catalog.model import Adapter, AdapterJson, Model
from llmgw.server.refusal import Refusal

# ``MODEL:ADAPTER``: model names hold no ':' (``model.MODEL_NAME``), so one split is exact.
SEPARATOR = ":"


def find(models: Mapping[str, Model], name: str) -> tuple[Model, Adapter] | None:
    """The model and adapter ``name`` means (``MODEL:ADAPTER``, or an adapter's own
    name); None when it means none (a model's own name included)."""
    if SEPARATOR in name:
        base, _, wanted = name.partition(SEPARATOR)
        model = models.get(base)
        adapter = _adapter(model, wanted) if model is not None else None
        return (model, adapter) if model is not None and adapter is not None else None
    for model in models.values():
        adapter = _adapter(model, name)
        if adapter is not None:
            return model, adapter
    return None


def _adapter(model: Model, name: str) -> Adapter | None:
    return next((a for a in model.adapters if a.name == name), None)


def holder(models: Mapping[str, Model], name: str) -> str | None:
    """Which model's adapter is named ``name``; None when no adapter is."""
    found = find(models, name) if SEPARATOR not in name else None
    return found[0].name if found else None


def name_taken(models: Mapping[str, Model], name: str, adding_to: str | None = None) -> str | None:
    """Why ``name`` cannot be a new model's name (``adding_to`` None) or a new adapter's
    of the model ``adding_to``, in words; None when it is free."""
    if adding_to is not None and name in models:
        return f"{name!r} is a model's name: an adapter is asked for by its name too"
    owner = holder(models, name)
    if owner is None:
        return None
    if adding_to is None:
        return (
            f"{name!r} is the name of an adapter of {owner}: clients ask for it by that "
            "name; give the model another --name"
        )
    return f"{name!r} is already the name of an adapter of {owner}; give it another name"


def request_names(models: Mapping[str, Model]) -> list[str]:
    """Every name a request's ``model`` may give, sorted: each model's, each adapter's
    own, and each ``MODEL:ADAPTER``."""
    out = set(models)
    for model in models.values():
        for a in model.adapters:
            out.update((a.name, f"{model.name}{SEPARATOR}{a.name}"))
    return sorted(out)


def adapter_json(adapter: Adapter) -> AdapterJson:
    """An adapter as the admin API shows it: plain fields, stable."""
    return adapter.to_spec()


def adapters_json(model: Model) -> list[AdapterJson]:
    return [adapter_json(a) for a in model.adapters]


def with_adapter(model: Model, adapter: Adapter) -> Model:
    """The model with ``adapter`` loaded after its others; Refusal when it has one of
    that name (the rest of the catalog is ``name_taken``'s to judge)."""
    if _adapter(model, adapter.name) is not None:
        raise Refusal(
            409, "exists", f"{model.name} already has an adapter {adapter.name!r}", "name"
        )
    return replace(model, adapters=(*model.adapters, adapter))


def without_adapter(model: Model, name: str) -> Model:
    """The model without its adapter ``name``; Refusal naming those it has otherwise."""
    if _adapter(model, name) is None:
        known = ", ".join(a.name for a in model.adapters) or "none"
        raise Refusal(404, "not_found", f"{model.name} has no adapter {name!r} (it has {known})")
    return replace(model, adapters=tuple(a for a in model.adapters if a.name != name))
