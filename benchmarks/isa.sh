# Sourced by the run_issue*.sh scripts: `hold_isa "$@"` reads their one option, `--isa avx2`,
# which runs everything as on a CPU with AVX2 and FMA but no AVX-512 or AMX: torch's kernels,
# MKL and oneDNN held to AVX2, and ours built for haswell. Sets HELD to "avx2" or "" (native).
hold_isa() {
  HELD=""
  case "${1:-}" in
    "") ;;
    --isa)
      [ "${2:-}" = avx2 ] || { echo "--isa: only 'avx2' is supported, got '${2:-}'" >&2; exit 2; }
      grep -qw avx2 /proc/cpuinfo || { echo "--isa avx2: this CPU has no AVX2" >&2; exit 2; }
      export ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
      export TANDEM_CPU_MARCH=haswell
      HELD=avx2 ;;
    *) echo "usage: $0 [--isa avx2]" >&2; exit 2 ;;
  esac
}
