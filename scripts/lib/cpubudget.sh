# Shared by the benchmark scripts: give processes CPU budgets with cgroup CPU
# quotas, so that on a small machine each process of a benchmark can have a
# CPU of its own, only a slower one. Source it; it needs write access to the
# cpu controller (root, or a delegated cgroup), cgroup v2 or v1.
#
#   budget_setup NAME                 # a parent group for this run
#   budget_group GROUP CPUS           # a child group allowed CPUS (0.3: 30% of one CPU)
#   budget_move GROUP PID             # move a running process (all its threads) into it
#   budget_enter GROUP                # move the calling (sub)shell into it; its children follow
#   budget_throttled GROUP            # prints "THROTTLED PERIODS": the periods it ran out of quota in, of all so far
#   budget_cleanup                    # move everything back out and remove the groups

budget_root="" budget_dir="" budget_v2=""

# budget_period_us is the quota's accounting period. A process that spends its
# budget early in a period waits for the next one, so a short period keeps
# those waits short next to a request's latency (the kernel's default is 100 ms).
budget_period_us="${BUDGET_PERIOD_US:-10000}"

budget_setup() {
  local v2root
  v2root="$(awk '$3 == "cgroup2" {print $2; exit}' /proc/mounts)"
  if [ -n "$v2root" ] && grep -qw cpu "$v2root/cgroup.controllers" 2>/dev/null; then
    budget_v2=1 budget_root="$v2root"
    grep -qw cpu "$budget_root/cgroup.subtree_control" || echo +cpu >"$budget_root/cgroup.subtree_control" || {
      echo "cannot enable the cpu controller in $budget_root/cgroup.subtree_control" >&2
      return 1
    }
  else
    budget_root="$(awk '$3 == "cgroup" && $4 ~ /(^|,)cpu(,|$)/ {print $2; exit}' /proc/mounts)"
    [ -n "$budget_root" ] && [ -e "$budget_root/cpu.cfs_quota_us" ] || {
      echo "no cgroup cpu controller is mounted: CPU budgets need cgroup v2 with cpu, or v1's cpu" >&2
      return 1
    }
  fi
  budget_dir="$budget_root/$1-$$"
  mkdir "$budget_dir" || {
    echo "cannot create a cgroup under $budget_root (CPU budgets need root or a delegated cgroup)" >&2
    return 1
  }
  if [ -n "$budget_v2" ]; then echo +cpu >"$budget_dir/cgroup.subtree_control"; fi
}

budget_group() {
  local dir="$budget_dir/$1" quota
  quota="$(awk -v c="$2" -v p="$budget_period_us" 'BEGIN {printf "%d", c * p}')"
  [ "$quota" -ge 1000 ] || { echo "a CPU budget of $2 is under the kernel's 1 ms quota floor at a ${budget_period_us} µs period" >&2; return 1; }
  mkdir "$dir"
  if [ -n "$budget_v2" ]; then
    echo "$quota $budget_period_us" >"$dir/cpu.max"
  else
    echo "$budget_period_us" >"$dir/cpu.cfs_period_us"
    echo "$quota" >"$dir/cpu.cfs_quota_us"
  fi
}

budget_move() { echo "$2" >"$budget_dir/$1/cgroup.procs"; }

budget_enter() { echo "$BASHPID" >"$budget_dir/$1/cgroup.procs"; }

budget_throttled() { awk '$1 == "nr_throttled" {t = $2} $1 == "nr_periods" {p = $2} END {print t + 0, p + 0}' "$budget_dir/$1/cpu.stat"; }

budget_cleanup() {
  [ -n "$budget_dir" ] && [ -d "$budget_dir" ] || return 0
  local g p
  for g in "$budget_dir"/*/; do
    [ -d "$g" ] || continue
    while read -r p; do echo "$p" >"$budget_root/cgroup.procs" 2>/dev/null || true; done <"$g/cgroup.procs"
    rmdir "$g" 2>/dev/null || true
  done
  rmdir "$budget_dir" 2>/dev/null || true
  budget_dir=""
}
