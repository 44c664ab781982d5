#!/bin/sh
# Record a real NVIDIA machine's outputs as fixtures for tests/agent/fixtures/:
# every nvidia-smi form the agent reads, the kernel's Xid lines, the cards' PCIe links,
# and NVML's answers through llmgw's own interface.
#
#   packaging/record-gpu.sh [OUT_DIR] [PYTHON]
#
# OUT_DIR defaults to ./gpu-record-HOSTNAME-DATE; PYTHON to the first python3 that can
# import llmgw (run it from a checkout with its .venv, or where llmgw is installed).
# Nothing is changed on the machine; commands a driver lacks leave a .err file instead.
set -u
out=${1:-"gpu-record-$(hostname -s)-$(date +%Y%m%d-%H%M%S)"}
py=${2:-}
if [ -z "$py" ]; then
  for candidate in .venv/bin/python python3; do
    if "$candidate" -c "import llmgw" 2>/dev/null; then py=$candidate; break; fi
  done
fi
mkdir -p "$out"
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1)
tag=${driver:-unknown-driver}

record() { # record NAME COMMAND...: stdout to NAME, stderr and exit status to NAME.err
  name=$1; shift
  if "$@" >"$out/$name" 2>"$out/$name.err"; then
    [ -s "$out/$name.err" ] || rm -f "$out/$name.err"
  else
    echo "exit $?: $*" >>"$out/$name.err"
  fi
}

record "nvidia-smi-q-x_$tag.xml" nvidia-smi -q -x
record "nvidia-smi-q_$tag.txt" nvidia-smi -q
record "nvidia-smi-L_$tag.txt" nvidia-smi -L
record "nvidia-smi-topo-m_$tag.txt" nvidia-smi topo -m
record "nvidia-smi-nvlink-s_$tag.txt" nvidia-smi nvlink -s
record "nvidia-smi-nvlink-e_$tag.txt" nvidia-smi nvlink -e
# The agent's own CSV query, and every field this nvidia-smi knows.
record "nvidia-smi-query-gpu_agent_$tag.csv" nvidia-smi \
  --query-gpu=index,uuid,name,memory.total,memory.used,utilization.gpu,compute_cap,driver_version \
  --format=csv,noheader,nounits
fields=$(nvidia-smi --help-query-gpu 2>/dev/null | sed -n 's/^"\([a-z_.]*\)".*/\1/p' | paste -sd, -)
[ -n "$fields" ] && record "nvidia-smi-query-gpu_all_$tag.csv" nvidia-smi \
  "--query-gpu=$fields" --format=csv
# The cards' PCIe links, and the kernel's Xid lines (root reads the whole log).
for bus in $(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader 2>/dev/null); do
  short=$(echo "$bus" | sed 's/^0000//' | tr 'A-F' 'a-f')
  record "lspci-vvv_$(echo "$short" | tr ':.' '--').txt" lspci -vvv -s "$short"
done
record "dmesg-Xid_$tag.txt" sh -c 'dmesg --time-format iso 2>/dev/null | grep "NVRM: Xid" || true'
if [ -n "$py" ]; then
  record "nvml_$tag.json" "$py" -m llmgw.agent.discovery.nvmlrecord
else
  echo "no python that imports llmgw: NVML not recorded" >"$out/nvml_$tag.json.err"
fi
echo "recorded into $out:"
ls -l "$out"
