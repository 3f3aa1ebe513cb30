# shellcheck shell=bash
# say and die for murmur's shell scripts, defined once (sourced, not run): a line on stderr,
# prefixed with who speaks, SAY_AS or else the script's file name. A script may redefine die to
# do more before it exits (job.sh reports first).
say() { echo "${SAY_AS:-${0##*/}}: $*" >&2; }
die() {
    say "$*"
    exit 1
}
