/* The engine's log: one line per event on stderr, prefixed "kvgate-engine: ".
 *
 * The bottom of the engine daemon's layers (see daemon_internal.h): it knows nothing
 * of the daemon, so every unit above may log without calling up. stderr is where the
 * engine's supervisor (systemd, a test harness) collects its output. */
#ifndef KVG_ENGINE_LOG_H
#define KVG_ENGINE_LOG_H

void kvg_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
