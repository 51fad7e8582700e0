"""Read a Kubernetes node list (``kubectl get nodes -o json``, or the API).

* Rack: the ClusterUUID part of ``nvidia.com/gpu.clique`` (``<ClusterUUID>.<CliqueId>``,
  set by GPU Feature Discovery once the NVLink fabric is up), or the whole value of
  another label named with ``rack_label`` (``ds.coreweave.com/nvlink.domain``).
  The CliqueId is a fabric-manager partition of that one NVLink domain, so it does
  not split the rack. A node without the label is its own single-node domain
  (HGX-style), named after the node.
* GPUs: ``status.capacity["nvidia.com/gpu"]``. A node without GPUs (control plane,
  CPU pool) is skipped and reported.
* State: the Ready condition False or Unknown (or absent) -> failed; cordoned
  (``spec.unschedulable``) or a NoSchedule/NoExecute taint -> draining; else
  healthy. Taints in ``BENIGN_TAINTS`` do not drain: ``nvidia.com/gpu`` is the
  taint clusters put on every GPU node to keep CPU pods off (GKE and AKS add it
  themselves), and the ``node.kubernetes.io/unschedulable|not-ready|unreachable``
  taints only mirror the cordon and the Ready condition, which are read directly.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import ijson

from fleet import jsonsafe
from fleet.topology.model import (
    DEFAULT_MAX_GPUS,
    DRAINING,
    FAILED,
    HEALTHY,
    MAX_EXTERNAL_ID,
    DesiredDomain,
    DesiredNode,
    Topology,
    TopologyError,
    check_domains,
    check_gpus,
    check_hostname,
    check_name,
    name_after_hostnames,
    read_text,
    show,
)

CLIQUE_LABEL = "nvidia.com/gpu.clique"
GPU_RESOURCE = "nvidia.com/gpu"
BENIGN_TAINTS = frozenset(
    {
        "nvidia.com/gpu",
        "node.kubernetes.io/unschedulable",
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    }
)
DRAINING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
MAX_JSON_DEPTH = 64
# ijson's C backend parses a whole read before yielding its first event, and its
# work grows with the square of the nesting inside one read: a 100,000-deep file
# took 43 s to refuse with ijson's 64 KiB reads, 0.03 s with 4 KiB ones (a 20 MB
# node list streams as fast, 0.8 s against 1.2 s).
READ_BYTES = 4096


def load_json(path: str | Path) -> Any:
    """Read a JSON file, or raise TopologyError naming the line and column."""
    text = read_text(str(path))
    try:
        # A node list nests a few levels; the bound keeps json's recursion safe.
        return jsonsafe.loads(text, MAX_JSON_DEPTH)
    except json.JSONDecodeError as exc:
        raise TopologyError(
            f"not valid JSON: {exc.msg} (column {exc.colno})", f"{path}:{exc.lineno}"
        ) from None
    except jsonsafe.TooDeep as exc:
        raise TopologyError(f"JSON nested too deeply to be a node list ({exc})", str(path)) from None
    except ValueError:  # Python refuses integers of more than 4,300 digits
        raise TopologyError("not valid JSON here: a number with more than 4,300 digits", str(path)) from None


NOT_A_NODE_LIST = 'expected a node list (an object with "items"), as `kubectl get nodes -o json` prints'
_OPEN, _CLOSE = ("start_map", "start_array"), ("end_map", "end_array")


def stream_items(path: str | Path) -> Iterator[Any]:
    """The items of a NodeList file, one at a time (ijson), so that memory holds
    one node's JSON at a time, not the file (a 20 MB list peaked under 2 MB).
    A file that is not valid JSON is read again as a whole by :func:`load_json`
    for its precise message (line and column, byte, depth, number)."""
    try:
        with open(path, "rb") as f:
            yield from _items(ijson.parse(f, use_float=True, buf_size=READ_BYTES), str(path))
    except OSError as exc:
        raise TopologyError(f"cannot read the file: {exc.strerror}", str(path)) from exc
    except (ijson.JSONError, UnicodeDecodeError, ValueError, _TooDeep):
        load_json(path)  # raises the precise TopologyError
        raise TopologyError("not valid JSON", str(path)) from None


class _TooDeep(Exception):
    pass


def _items(events: Iterable[tuple[str, str, Any]], place: str) -> Iterator[Any]:
    """Each element of the top-level object's "items" array, built from ijson's
    events (the array itself is never held); the nesting is bounded as load_json's."""
    depth, builder, found = 0, None, False
    for prefix, event, value in events:
        if depth == 0 and event != "start_map":
            raise TopologyError(NOT_A_NODE_LIST, place)
        if event in _OPEN:
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise _TooDeep
        elif event in _CLOSE:
            depth -= 1
        if prefix == "items":  # only the array's own start and end carry this prefix
            if event not in ("start_array", "end_array"):
                raise TopologyError(NOT_A_NODE_LIST, place)
            found = True
        elif builder is not None:
            builder.event(event, value)
            if depth == 2:  # the item closed
                yield builder.value
                builder = None
        elif prefix == "items.item":
            if event in _OPEN:
                builder = ijson.ObjectBuilder()
                builder.event(event, value)
            else:
                yield value  # a scalar item: parse_items refuses it, by its place
    if not found:
        raise TopologyError(NOT_A_NODE_LIST, place)


def _object(value: Any, place: str) -> dict[str, Any]:
    """An optional JSON object (absent or null: empty), or TopologyError."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TopologyError(f"must be an object, found {show(value)}", place)
    return value


def _place(prefix: str, path: str) -> str:
    return f"{prefix}{path}" if prefix else path


def _node_state(item: dict[str, Any], where: str) -> tuple[str, str]:
    status = _object(item.get("status"), f"{where}.status")
    conditions = status.get("conditions") or []
    if not isinstance(conditions, list):
        raise TopologyError("conditions must be a list", f"{where}.status.conditions")
    ready = next((c for c in conditions if isinstance(c, dict) and c.get("type") == "Ready"), None)
    if ready is None:
        return FAILED, "NotReady: no Ready condition reported"
    if ready.get("status") != "True":
        why, message = ready.get("reason") or f"Ready={ready.get('status')}", ready.get("message") or ""
        return FAILED, (f"NotReady ({why}): {message}" if message else f"NotReady ({why})")[:500]
    spec = _object(item.get("spec"), f"{where}.spec")
    if spec.get("unschedulable"):
        return DRAINING, "cordoned in Kubernetes"
    taints = spec.get("taints") or []
    if not isinstance(taints, list):
        raise TopologyError(f"taints must be a list, found {show(taints)}", f"{where}.spec.taints")
    for i, taint in enumerate(taints):
        if not isinstance(taint, dict) or not isinstance(taint.get("key"), str):
            raise TopologyError("a taint needs a key (a string)", f"{where}.spec.taints[{i}]")
        if not isinstance(taint.get("effect", ""), str):
            raise TopologyError("a taint's effect must be a string", f"{where}.spec.taints[{i}].effect")
        if taint["key"] in BENIGN_TAINTS or taint.get("effect") not in DRAINING_EFFECTS:
            continue
        value = f"={taint['value']}" if taint.get("value") else ""
        return DRAINING, f"tainted {taint['key']}{value}:{taint['effect']}"[:500]
    return HEALTHY, ""


def _gpus(item: dict[str, Any], where: str, max_gpus: int) -> int:
    status = _object(item.get("status"), f"{where}.status")
    capacity = status.get("capacity") or {}
    if not isinstance(capacity, dict):
        raise TopologyError("capacity must be an object", f"{where}.status.capacity")
    raw = capacity.get(GPU_RESOURCE)
    place = f'{where}.status.capacity["{GPU_RESOURCE}"]'
    if raw is None:
        return 0
    # Kubernetes quantities are strings ("4"); a whole JSON number is read too.
    text = (
        raw
        if isinstance(raw, str)
        else str(raw)
        if isinstance(raw, int) and not isinstance(raw, bool)
        else None
    )
    if text is None or not text.strip().lstrip("-").isdigit():
        raise TopologyError(f"GPU capacity {show(raw)} is not a whole number", place)
    if len(text.strip()) > 9:  # int() of thousands of digits is slow, and no node has that many
        raise TopologyError(f"GPU capacity {show(raw)} is far more than any node has", place)
    gpus = int(text)
    if gpus < 0:
        raise TopologyError(f"GPU capacity {gpus} is negative", place)
    return check_gpus(gpus, max_gpus, place)


def _rack_key(labels: dict[str, Any], label: str, where: str) -> str | None:
    value = labels.get(label)
    if value is None or value == "":
        return None
    place = f'{where}.metadata.labels["{label}"]'
    if label == CLIQUE_LABEL:
        check_name(value, "the clique label", MAX_EXTERNAL_ID, place)
        cluster, dot, clique = value.rpartition(".")
        if not dot or not cluster or not clique:
            raise TopologyError(f"{show(value)} is not <ClusterUUID>.<CliqueId>", place)
        return cluster
    return check_name(value, "the rack label", MAX_EXTERNAL_ID, place)


def parse_nodes(
    doc: Any,
    *,
    rack_label: str = CLIQUE_LABEL,
    source: str = "kubernetes",
    place: str = "",
    max_gpus: int = DEFAULT_MAX_GPUS,
) -> Topology:
    """Turn a NodeList (``{"items": [...]}``) into a Topology. ``place`` prefixes
    error locations (the file name). Every value is type-checked before it is
    read, names against the columns they go to, GPU counts against ``max_gpus``."""
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
        raise TopologyError(NOT_A_NODE_LIST, place)
    return parse_items(doc["items"], rack_label=rack_label, source=source, place=place, max_gpus=max_gpus)


def parse_items(
    items: Iterable[Any],
    *,
    rack_label: str = CLIQUE_LABEL,
    source: str = "kubernetes",
    place: str = "",
    max_gpus: int = DEFAULT_MAX_GPUS,
) -> Topology:
    """:func:`parse_nodes` over a NodeList's items, which may come one at a time
    (:func:`stream_items`)."""
    prefix = f"{place}: " if place else ""
    domains: dict[str, DesiredDomain] = {}
    where_of: dict[str, str] = {}
    skipped: list[tuple[str, str]] = []
    for i, item in enumerate(items):
        where = f"items[{i}]"
        if not isinstance(item, dict):
            raise TopologyError("a node must be an object", _place(prefix, where))
        if item.get("kind", "Node") != "Node":
            raise TopologyError(
                f"expected kind Node, found {show(item.get('kind'))}", _place(prefix, f"{where}.kind")
            )
        try:
            metadata = _object(item.get("metadata"), f"{where}.metadata")
            if metadata.get("name") in (None, ""):
                raise TopologyError("a node needs a name", f"{where}.metadata.name")
            name = check_hostname(metadata["name"], "node name", f"{where}.metadata.name")
            gpus = _gpus(item, where, max_gpus)
            if gpus == 0:
                skipped.append((name, f"no {GPU_RESOURCE} capacity"))
                continue
            labels = _object(metadata.get("labels"), f"{where}.metadata.labels")
            key = _rack_key(labels, rack_label, where)
            state, reason = _node_state(item, where)
        except TopologyError as exc:
            raise TopologyError(exc.message, _place(prefix, exc.place)) from None
        if name in where_of:
            raise TopologyError(f"node {name} is listed twice (also {where_of[name]})", _place(prefix, where))
        where_of[name] = _place(prefix, where)
        # A node without the rack label is an NVLink domain of its own (HGX).
        domain_key = key if key is not None else name
        domain = domains.setdefault(domain_key, DesiredDomain(name=domain_key, external_id=domain_key))
        domain.nodes.append(DesiredNode(hostname=name, gpus=gpus, state=state, reason=reason))
    result = list(domains.values())
    check_domains(result, where_of)
    if rack_label == CLIQUE_LABEL:
        # A ClusterUUID means nothing on an operator's screen; the UUID stays the
        # external id, so re-imports still match and a rack that exists keeps its name.
        name_after_hostnames(result)
    return Topology(source=source, domains=result, skipped=skipped)


def fetch_nodes(
    kubeconfig: str | None = None, context: str | None = None, page_size: int = 500
) -> dict[str, Any]:
    """Read ``/api/v1/nodes`` through the official client, page by page as kubectl
    does, and return it shaped like ``kubectl get nodes -o json``."""
    # The official client is loaded only for a live read (`--from kubernetes-live`).
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException

    try:
        api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
    except (ConfigException, OSError) as exc:
        raise TopologyError(f"cannot load the kubeconfig: {exc}", kubeconfig or "kubeconfig") from exc
    server = api_client.configuration.host
    items: list[Any] = []
    token: str | None = None
    try:
        with api_client:
            api = client.CoreV1Api(api_client)
            while True:
                kwargs: dict[str, Any] = {
                    "limit": page_size,
                    "_preload_content": False,
                    "_request_timeout": 30,
                }
                if token:
                    kwargs["_continue"] = token
                page = json.loads(api.list_node(**kwargs).data)
                items.extend(page.get("items") or [])
                token = (page.get("metadata") or {}).get("continue")
                if not token:
                    break
    except ApiException as exc:
        raise TopologyError(f"the API server answered {exc.status} {exc.reason}", server) from exc
    except json.JSONDecodeError as exc:
        raise TopologyError(f"the API server sent something that is not JSON: {exc.msg}", server) from exc
    except Exception as exc:  # urllib3 connection errors have no common base we can name cheaply
        raise TopologyError(f"cannot list nodes: {exc.__class__.__name__}: {exc}"[:300], server) from exc
    return {"apiVersion": "v1", "kind": "List", "items": items}
