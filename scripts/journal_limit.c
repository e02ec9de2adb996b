/*
 * journal_limit.c - what a broker and librdkafka allow for the processor's write pattern, with no
 * processing: each request writes three records one after the other, each produced only once the
 * one before it is acknowledged (the intent on the journal topic, the outcome, the result on the
 * journal topic), with IN_FLIGHT requests at once (the processor's --buffer-size). It consumes
 * nothing: the requests are made up here, each for a random one of USERS users. A user's requests
 * are not kept in order as the processor's lanes keep them (two of one user may be in flight at
 * once), so it is a looser bound than the processor's own pattern.
 *
 * Usage: journal_limit BOOTSTRAP N
 *   Environment: JOURNAL_TOPIC=bench.jl-journal OUT_TOPIC=bench.jl-outcomes (both created
 *   beforehand), IN_FLIGHT=5000 USERS=10000 LINGER_MS=5, BROKER_PID (for the broker's CPU).
 * Prints one line: RESULT ... rate=REQUESTS/s records_rate=... client_cpu_s=... broker_cpu_s=...
 * The producer is configured as the processor's: acks=all, idempotence, linger.ms 5, murmur2.
 */
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>

enum { STAGES = 3 };

struct request {
        int stage; /* 0 intent, 1 outcome, 2 result */
        unsigned user;
        unsigned slot;
};

static rd_kafka_t *producer;
static rd_kafka_topic_t *journal_topic, *outcome_topic;
static long wanted, issued, finished;
static int users;
static unsigned long long random_state = 0x9E3779B97F4A7C15ull;
static char value[512];

static double now(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return ts.tv_sec + ts.tv_nsec / 1e9;
}
static double cpu_self(void) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}
static double cpu_of(int pid) {
        char path[64], buf[2048];
        if (pid <= 0) return -1;
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        FILE *f = fopen(path, "r");
        if (!f) return -1;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        char *end = strrchr(buf, ')');
        unsigned long user_ticks = 0, system_ticks = 0;
        if (!end || sscanf(end + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &user_ticks,
                           &system_ticks) != 2)
                return -1;
        return (double)(user_ticks + system_ticks) / sysconf(_SC_CLK_TCK);
}
static unsigned next_random(void) {
        random_state ^= random_state << 13;
        random_state ^= random_state >> 7;
        random_state ^= random_state << 17;
        return (unsigned)(random_state >> 16);
}
static int env_int(const char *name, int fallback) {
        const char *v = getenv(name);
        return v && *v ? atoi(v) : fallback;
}
static const char *env_text(const char *name, const char *fallback) {
        const char *v = getenv(name);
        return v && *v ? v : fallback;
}
static void set(rd_kafka_conf_t *conf, const char *key, const char *val) {
        char error[512];
        if (rd_kafka_conf_set(conf, key, val, error, sizeof error) != RD_KAFKA_CONF_OK) {
                fprintf(stderr, "journal_limit: %s=%s: %s\n", key, val, error);
                exit(1);
        }
}

/* Produces the request's current stage: the journal records keyed as the processor keys them
 * (":{slot}:{user}", the intent and result of a request sharing one), the outcome by the user. */
static void produce(struct request *r) {
        char key[64];
        int key_length;
        rd_kafka_topic_t *topic;
        size_t value_length;
        if (r->stage == 1) {
                key_length = snprintf(key, sizeof key, "app_bench:user-%06u", r->user);
                topic = outcome_topic;
                value_length = 330;
        } else {
                key_length = snprintf(key, sizeof key, ":%u:app_bench:user-%06u", r->slot, r->user);
                topic = journal_topic;
                value_length = 225;
        }
        while (rd_kafka_produce(topic, RD_KAFKA_PARTITION_UA, RD_KAFKA_MSG_F_COPY, value, value_length, key,
                                key_length, r) == -1) {
                if (rd_kafka_last_error() != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
                        fprintf(stderr, "journal_limit: produce: %s\n", rd_kafka_err2str(rd_kafka_last_error()));
                        exit(1);
                }
                rd_kafka_poll(producer, 1);
        }
}

static void start(struct request *r) {
        issued++;
        r->stage = 0;
        r->user = next_random() % (unsigned)users;
        r->slot = (unsigned)(issued % 100);
        produce(r);
}

static void delivered(rd_kafka_t *rk, const rd_kafka_message_t *message, void *opaque) {
        (void)rk;
        (void)opaque;
        struct request *r = message->_private;
        if (message->err) {
                fprintf(stderr, "journal_limit: delivery: %s\n", rd_kafka_err2str(message->err));
                exit(1);
        }
        if (++r->stage < STAGES) {
                produce(r);
                return;
        }
        finished++;
        if (issued < wanted) start(r);
}

int main(int argc, char **argv) {
        if (argc < 3) {
                fprintf(stderr, "usage: journal_limit BOOTSTRAP N\n");
                return 2;
        }
        wanted = atol(argv[2]);
        users = env_int("USERS", 10000);
        int in_flight = env_int("IN_FLIGHT", 5000);
        int broker_pid = env_int("BROKER_PID", 0);
        if (wanted < 1 || users < 1 || in_flight < 1) {
                fprintf(stderr, "journal_limit: N, USERS and IN_FLIGHT must be at least 1\n");
                return 2;
        }
        memset(value, 'x', sizeof value);

        char error[512], linger[16];
        snprintf(linger, sizeof linger, "%d", env_int("LINGER_MS", 5));
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        set(conf, "bootstrap.servers", argv[1]);
        set(conf, "acks", "all");
        set(conf, "enable.idempotence", "true");
        set(conf, "linger.ms", linger);
        set(conf, "partitioner", "murmur2_random");
        set(conf, "queue.buffering.max.messages", "1000000");
        rd_kafka_conf_set_dr_msg_cb(conf, delivered);
        producer = rd_kafka_new(RD_KAFKA_PRODUCER, conf, error, sizeof error);
        if (!producer) {
                fprintf(stderr, "journal_limit: %s\n", error);
                return 1;
        }
        journal_topic = rd_kafka_topic_new(producer, env_text("JOURNAL_TOPIC", "bench.jl-journal"), NULL);
        outcome_topic = rd_kafka_topic_new(producer, env_text("OUT_TOPIC", "bench.jl-outcomes"), NULL);

        /* Connected and the topics' leaders known before the clock starts: one request, untimed. */
        struct request warm_up;
        long warm_up_wanted = wanted;
        wanted = 1;
        start(&warm_up);
        while (finished < 1) rd_kafka_poll(producer, 10);
        wanted = warm_up_wanted;
        issued = finished = 0;

        struct request *requests = calloc((size_t)in_flight, sizeof *requests);
        if (!requests) {
                fprintf(stderr, "journal_limit: out of memory\n");
                return 1;
        }
        double t0 = now(), cpu0 = cpu_self(), broker0 = cpu_of(broker_pid);
        for (int i = 0; i < in_flight && issued < wanted; i++) start(&requests[i]);
        while (finished < wanted) rd_kafka_poll(producer, 5);
        double elapsed = now() - t0, cpu = cpu_self() - cpu0;
        double broker = broker0 >= 0 ? cpu_of(broker_pid) - broker0 : -1;
        printf("RESULT impl=journal_limit.c lib=%s n=%ld in_flight=%d users=%d elapsed_s=%.3f rate=%.0f "
               "records_rate=%.0f client_cpu_s=%.2f broker_cpu_s=%.2f\n",
               rd_kafka_version_str(), wanted, in_flight, users, elapsed, wanted / elapsed,
               wanted * STAGES / elapsed, cpu, broker);
        rd_kafka_flush(producer, 10000);
        rd_kafka_topic_destroy(journal_topic);
        rd_kafka_topic_destroy(outcome_topic);
        rd_kafka_destroy(producer);
        free(requests);
        return 0;
}
