package maps

import "github.com/isthmus-dev/isthmus/bpf"

// ConfigFlagTrace is CFG_F_TRACE of bpf/lib/types.h: packets matching trace_prefixes
// emit a TraceEvent at every decision. `isthmus trace` sets it while it runs; the
// agent's sync keeps whatever the kernel holds (loader/agent).
const ConfigFlagTrace uint32 = 1 << 1

// TraceEvent is struct trace_event, one record of the trace_events ring buffer.
type TraceEvent = bpf.IsthmusTraceEvent

// TracePrefixValue is the value of trace_prefixes (key RouteKey).
type TracePrefixValue = bpf.IsthmusTracePrefixValue

// The tracing maps. They are pinned by name like the others but are not in AllMaps:
// they hold no state a restart or a layout migration must carry (the ring buffer is
// transient, trace_prefixes belongs to the running `isthmus trace`).
const (
	MapTraceEvents   Name = "trace_events"
	MapTracePrefixes Name = "trace_prefixes"
)
