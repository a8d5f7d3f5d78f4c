# slurm-preempt hook library, POSIX sh. Sourced by the installed prolog, epilog, epilog-slurmctld and
# taskprolog from their own root-owned folder; it reads hooks.conf there and nothing users can write.
#
# Every path must end in `exit 0`: a prolog that fails drains the node and holds the job, an epilog
# that fails drains the node. Problems go to syslog (and to `log=` in hooks.conf when set).

# Slurm runs hooks with no search path (and we never trust an inherited one).
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
IFS=' 	
'
umask 022
# Noclobber: `>` refuses an existing file (O_EXCL), so a temp name can never be a planted file.
set -C

SP_STATE_DIR=/var/lib/slurm-preempt
SP_LOG=
SP_SLURM_GID=  # group of SlurmUser when it is not root (EpilogSlurmctld runs as SlurmUser)
SP_HERE=${0%/*}

sp_log() {
	logger -t slurm-preempt -p daemon.warning -- "$SP_HOOK: $*" 2>/dev/null
	if [ -n "$SP_LOG" ] && sp_log_closed; then
		printf '%s %s[%s]: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$SP_HOOK" "$$" "$*" >>"$SP_LOG" 2>/dev/null
	fi
	return 0
}

# The log file is appended to by path: only in a folder of root's that no one else may write, where no
# user can put a link (checked with -L first, then followed by `>>`) between the check and the write.
sp_log_closed() {
	case $SP_LOG in /*) ;; *) return 1 ;; esac
	[ ! -L "$SP_LOG" ] || return 1
	set -- $(stat -c '%u %a %F' -- "${SP_LOG%/*}/." 2>/dev/null)
	[ "$1" = 0 ] && [ "$3" = directory ] || return 1
	case $2 in *[2367] | *[2367]?) return 1 ;; esac
	return 0
}

# hooks.conf: `key=value` lines, parsed (never sourced).
sp_read_conf() {
	[ -f "$1" ] || return 0
	while IFS='=' read -r key value; do
		case $key in
		state_dir) SP_STATE_DIR=$value ;;
		log) SP_LOG=$value ;;
		slurm_gid) sp_is_number "$value" && SP_SLURM_GID=$value ;;
		esac
	done <"$1"
	return 0
}

# A JSON string. Fast path without a fork; values with quotes, backslashes or control bytes are
# cleaned by sed/tr (a job comment or constraint is user text).
sp_str() {
	case $1 in
	*[\"\\]* | *[[:cntrl:]]*)
		printf '"%s"' "$(printf '%s' "$1" | tr -d '\000-\037\177' | sed 's/[\\"]/\\&/g')"
		;;
	*) printf '"%s"' "$1" ;;
	esac
}

sp_is_number() {
	case $1 in '' | *[!0-9]*) return 1 ;; esac
	return 0
}

# stat without following links: "<uid> <gid> <octal mode> <type>" per path. True when the folder is
# not root's, or others can write it, or its group can and that group is not SlurmUser's, or has no
# sticky bit (%a prints it as a 4th digit: 1775): without it any member of that group could rename or
# delete other jobs' folders and race the hooks' moves.
sp_unsafe_dir() {
	set -- $1
	[ "$1" = 0 ] || return 0
	[ "$4" = directory ] || return 0
	case $3 in *[2367]) return 0 ;; esac
	case $3 in *[2367]?)
		[ -n "$SP_SLURM_GID" ] && [ "$2" = "$SP_SLURM_GID" ] || return 0
		case $3 in [1357]???) ;; *) return 0 ;; esac
		;;
	esac
	return 1
}

# Load config, check the environment Slurm gave us and the state folder. Returns 1 to skip quietly.
sp_init() {
	SP_HOOK=$1
	sp_read_conf "$SP_HERE/hooks.conf"
	[ -f "$SP_HERE/../slurm-preempt/hooks.conf" ] && sp_read_conf "$SP_HERE/../slurm-preempt/hooks.conf"
	SP_JOB=${SLURM_JOB_ID:-}
	if ! sp_is_number "$SP_JOB"; then
		sp_log "SLURM_JOB_ID is not a job id; nothing recorded"
		return 1
	fi
	SP_RESTART=${SLURM_JOB_RESTART_COUNT:-0}
	sp_is_number "$SP_RESTART" || SP_RESTART=0
	SP_NODES=${SLURM_JOB_NODELIST:-${SLURM_NODELIST:-}}
	read -r SP_HOST </proc/sys/kernel/hostname 2>/dev/null || SP_HOST=unknown
	SP_HOST=${SP_HOST%%.*}
	case $SP_HOST in *[!A-Za-z0-9_-]* | '') SP_HOST=unknown ;; esac
	SP_JOBS=$SP_STATE_DIR/jobs
	case $SP_STATE_DIR in /*) ;; *)
		sp_log "state_dir $SP_STATE_DIR is not an absolute path; nothing recorded"
		return 1
		;;
	esac
	if [ ! -d "$SP_STATE_DIR" ]; then
		sp_log "state folder $SP_STATE_DIR is missing; job $SP_JOB not recorded"
		return 1
	fi
	[ -e "$SP_JOBS" ] || [ -L "$SP_JOBS" ] || mkdir -m 0755 "$SP_JOBS" 2>/dev/null
	SP_STAT=$(stat -c '%u %g %a %F' -- "$SP_STATE_DIR/." "$SP_JOBS" 2>/dev/null) || {
		sp_log "cannot stat $SP_JOBS; job $SP_JOB not recorded"
		return 1
	}
	for line in "${SP_STAT%%
*}" "${SP_STAT#*
}"; do
		if sp_unsafe_dir "$line"; then
			sp_log "$SP_STATE_DIR or its jobs/ is not a root-owned folder closed to others ($line); job $SP_JOB not recorded"
			return 1
		fi
	done
	SP_DIR=$SP_JOBS/$SP_JOB
	return 0
}

# The job's folder: created by root, then given to the job's owner (mode 0700) so that the job can
# add its own events and no other user can read them; with a non-root SlurmUser, group SlurmUser's and
# mode 1770 (sticky: that group's members delete only their own files), so that EpilogSlurmctld can add
# the end. A folder root made first (the watcher wrote an event before the job started) is handed over
# the same way. At the first attempt (restart count 0) a folder of an earlier job with this id (Slurm
# reuses ids after MaxJobId wraps or its state is reset) is moved aside: one of another user, or one of
# root's that already holds an attempt's start; otherwise its owner could read this job's notices and
# plant events it would believe.
sp_job_dir() {
	uid=${SLURM_JOB_UID:-}
	sp_is_number "$uid" || uid=0
	mode=0700 group=
	if [ -n "$SP_SLURM_GID" ]; then mode=1770 group=$SP_SLURM_GID; fi
	[ "$SP_RESTART" = 0 ] && sp_set_aside_earlier "$uid"
	if mkdir -m "$mode" -- "$SP_DIR" 2>/dev/null; then
		sp_give_dir "$uid" "$group"
		return 0
	fi
	[ "$(stat -c '%u %F' -- "$SP_DIR" 2>/dev/null)" = "0 directory" ] && sp_give_dir "$uid" "$group"
	sp_job_dir_ok
}

sp_give_dir() {
	if [ "$1" != 0 ] || [ -n "$2" ]; then
		chmod -- "$mode" "$SP_DIR" 2>/dev/null
		chown -h -- "$1${2:+:$2}" "$SP_DIR" 2>/dev/null || sp_log "cannot give $SP_DIR to uid $1"
	fi
	return 0
}

sp_set_aside_earlier() {
	found=$(stat -c '%u %F' -- "$SP_DIR" 2>/dev/null) || return 0
	case $found in
	"$1 directory") return 0 ;;
	"0 directory")
		set -- "$SP_DIR"/*-attempt_start.json
		[ -e "$1" ] || return 0
		;;
	esac
	aside=$SP_JOBS/.earlier-$SP_JOB-$(date -u +%s%N)
	if mv -T -- "$SP_DIR" "$aside" 2>/dev/null; then
		sp_log "job id $SP_JOB reused: moved the earlier folder ($found) aside to $aside"
	else
		sp_log "job id $SP_JOB reused: cannot move the earlier folder ($found) aside"
	fi
	return 0
}

sp_job_dir_ok() {
	found=$(stat -c '%u %F' -- "$SP_DIR" 2>/dev/null) || {
		sp_log "no folder $SP_DIR; job $SP_JOB not recorded"
		return 1
	}
	case $found in
	"0 directory" | "${SLURM_JOB_UID:-x} directory") return 0 ;;
	esac
	sp_log "$SP_DIR is not a folder of root or the job's owner ($found); not recorded"
	return 1
}

# sp_event KIND 'extra JSON members' : write the event to a temp file in the root-owned jobs/
# folder, then rename it into the job's folder (rename replaces a planted symlink, never follows it).
sp_event() {
	now=$(date -u '+%s%N %Y-%m-%dT%H:%M:%S.%3NZ') || return 0
	ns=${now%% *}
	tmp=$SP_JOBS/.hook-$ns-$$
	body="{\"kind\": \"$1\", \"job_id\": \"$SP_JOB\", \"time\": \"${now#* }\", \"host\": \"$SP_HOST\""
	body="$body, \"source\": \"hook\", \"hook\": \"$SP_HOOK\", \"restart_count\": $SP_RESTART"
	body="$body, \"nodes\": $(sp_str "$SP_NODES")$2}"
	if ! printf '%s\n' "$body" >"$tmp" 2>/dev/null; then
		rm -f -- "$tmp" 2>/dev/null
		sp_log "cannot write $tmp (read-only or full?); job $SP_JOB $1 not recorded"
		return 0
	fi
	if ! mv -fT -- "$tmp" "$SP_DIR/$ns-$SP_HOST-$$-$1.json" 2>/dev/null; then
		rm -f -- "$tmp" 2>/dev/null
		sp_log "cannot move the event into $SP_DIR; job $SP_JOB $1 not recorded"
	fi
	return 0
}
