/* An LD_PRELOAD shim for t/gateway-thread-exit.t: slow thread ends and a slow process end.
 *
 * Every thread the process creates gets a value under a key of ours whose destructor
 * sleeps 100 ms. The key is made before any module is loaded, so it has a lower index
 * than any key a module makes, and glibc runs destructors in index order: a thread in
 * pthread_exit sleeps first, then runs the module's destructors. An exit handler of ours
 * sleeps 400 ms, so a process that calls exit() lives on meanwhile. Together they turn
 * a rare interleaving into a certain one: a worker that unloads its modules and exits
 * while its threads are still ending has those threads call module code after it is
 * unmapped (SIGSEGV) unless the module is kept mapped. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

typedef int create_fn(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);

struct start {
    void *(*fn)(void *);
    void *arg;
};

static pthread_key_t slow_key;

static void nap(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static void slow_destructor(void *value)
{
    (void)value;
    nap(100);
}

static void slow_exit(void)
{
    nap(400);
}

static void *slow_start(void *p)
{
    struct start s = *(struct start *)p;
    free(p);
    pthread_setspecific(slow_key, &slow_key);
    return s.fn(s.arg);
}

int pthread_create(pthread_t *thread, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
    create_fn *real = (create_fn *)dlsym(RTLD_NEXT, "pthread_create");
    struct start *s = malloc(sizeof *s);
    if (!real || !s) {
        free(s);
        return real ? real(thread, attr, fn, arg) : -1;
    }
    s->fn = fn;
    s->arg = arg;
    int rc = real(thread, attr, slow_start, s);
    if (rc != 0)
        free(s);
    return rc;
}

__attribute__((constructor)) static void slow_init(void)
{
    pthread_key_create(&slow_key, slow_destructor);
    atexit(slow_exit);
}
