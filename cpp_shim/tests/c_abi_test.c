/* c_abi_test.c — exercises equarx's C ABI (include/equarx.h) from C, linked
 * against libequarx.so. Run by tests/c_abi.rs:
 *
 *   c_abi_test FIXTURES_DIR EXPECTED_VERSION
 *
 * Prints one line per check; exits 0 when all pass. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "equarx.h"

static int failures = 0;
static int checks = 0;

#define CHECK(cond, ...)                                       \
  do {                                                         \
    checks++;                                                  \
    if (!(cond)) {                                             \
      failures++;                                              \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                            \
      fprintf(stderr, "\n");                                   \
    }                                                          \
  } while (0)

typedef struct {
  uint8_t* data;
  size_t len;
} buffer;

static buffer read_file(const char* dir, const char* name) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE* f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "cannot open %s\n", path);
    exit(2);
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  buffer b = {malloc((size_t)n), (size_t)n};
  if (fread(b.data, 1, b.len, f) != b.len) {
    fprintf(stderr, "cannot read %s\n", path);
    exit(2);
  }
  fclose(f);
  return b;
}

static char* copy_string(const char* s) {
  size_t n = strlen(s) + 1;
  char* c = malloc(n);
  memcpy(c, s, n);
  return c;
}

static const char* RING = "{\"min_payload_bytes\": 0, \"pipeline_depth\": 1}";

/* ---- single calls ------------------------------------------------------ */

static void test_rewrite_fixture(const char* dir) {
  buffer in = read_file(dir, "psum_bf16_p8.pb");
  equarx_result r = {sizeof(equarx_result)};
  equarx_status s = equarx_rewrite(in.data, in.len, RING, &r);
  CHECK(s == EQUARX_OK, "status %d: %s", s, r.error ? r.error : "");
  CHECK(r.changed == 1, "changed = %d", r.changed);
  CHECK(r.module != NULL && r.module_len > in.len, "module %p, %zu bytes",
        (void*)r.module, r.module_len);
  CHECK(r.error == NULL, "error set on success");
  CHECK(r.report_json && strstr(r.report_json, "\"rewritten\":true"),
        "report: %s", r.report_json ? r.report_json : "(null)");
  printf("rewrote psum_bf16_p8.pb: %zu -> %zu bytes; report %.120s...\n",
         in.len, r.module_len, r.report_json ? r.report_json : "");

  /* The output is a module equarx reads back, with nothing left to do. */
  equarx_result again = {sizeof(equarx_result)};
  s = equarx_rewrite(r.module, r.module_len, RING, &again);
  CHECK(s == EQUARX_OK, "re-read status %d: %s", s,
        again.error ? again.error : "");
  CHECK(again.changed == 0 && again.module == NULL,
        "second rewrite changed = %d", again.changed);
  equarx_free_result(&again);
  equarx_free_result(&r);
  CHECK(r.module == NULL && r.report_json == NULL, "free nulls the fields");
  equarx_free_result(&r); /* freeing twice is allowed */
  free(in.data);
}

static void test_ineligible_is_unchanged(const char* dir) {
  buffer in = read_file(dir, "psum_f32_p8.pb");
  equarx_result r = {sizeof(equarx_result)};
  equarx_status s = equarx_rewrite(in.data, in.len, RING, &r); /* bf16 only */
  CHECK(s == EQUARX_OK, "status %d", s);
  CHECK(r.changed == 0 && r.module == NULL, "f32 all-reduce changed");
  CHECK(r.report_json && strstr(r.report_json, "is not enabled"),
        "report says why: %s", r.report_json ? r.report_json : "(null)");
  equarx_free_result(&r);
  free(in.data);
}

static void test_errors(void) {
  static const uint8_t garbage[] = {0xff, 0xfe, 'n', 'o', 't', 0x00, 0x12, 0x07};
  equarx_result r = {sizeof(equarx_result)};
  equarx_status s = equarx_rewrite(garbage, sizeof garbage, NULL, &r);
  CHECK(s == EQUARX_INVALID_MODULE, "garbage: status %d", s);
  CHECK(r.error && strlen(r.error) > 10, "garbage: message");
  CHECK(r.module == NULL && r.report_json == NULL && r.changed == 0,
        "garbage: no outputs");
  printf("garbage bytes -> status %d: %s\n", s, r.error ? r.error : "");
  equarx_free_result(&r);

  s = equarx_rewrite(NULL, 0, NULL, &r);
  CHECK(s == EQUARX_INVALID_MODULE && r.error && strstr(r.error, "empty"),
        "empty input: %d %s", s, r.error ? r.error : "");
  equarx_free_result(&r);

  s = equarx_rewrite(NULL, 100, NULL, &r);
  CHECK(s == EQUARX_INVALID_ARGUMENT && r.error &&
            strstr(r.error, "module is null but its length is 100"),
        "null module: %d %s", s, r.error ? r.error : "");
  equarx_free_result(&r);

  CHECK(equarx_rewrite(garbage, sizeof garbage, NULL, NULL) ==
            EQUARX_INVALID_ARGUMENT,
        "null result");
  equarx_result small = {0};
  small.changed = 42;
  CHECK(equarx_rewrite(garbage, sizeof garbage, NULL, &small) ==
                EQUARX_INVALID_ARGUMENT &&
            small.changed == 42,
        "struct_size 0 is refused and nothing is written");

  s = equarx_rewrite(garbage, sizeof garbage, "{\"block_size\": 0}", &r);
  CHECK(s == EQUARX_INVALID_OPTIONS && r.error &&
            strstr(r.error, "block size must be in 1..="),
        "bad options: %d %s", s, r.error ? r.error : "");
  equarx_free_result(&r);
  s = equarx_rewrite(garbage, sizeof garbage, "{\"blocksize\": 8}", &r);
  CHECK(s == EQUARX_INVALID_OPTIONS && r.error &&
            strstr(r.error, "unknown option \"blocksize\" (the pass options are "),
        "unknown option: %d %s", s, r.error ? r.error : "");
  equarx_free_result(&r);
  s = equarx_rewrite(garbage, sizeof garbage, "\xff\xfe", &r);
  CHECK(s == EQUARX_INVALID_OPTIONS && r.error && strstr(r.error, "UTF-8"),
        "non-UTF-8 options: %d %s", s, r.error ? r.error : "");
  equarx_free_result(&r);

  char* err = NULL;
  CHECK(equarx_check_options(RING, &err) == EQUARX_OK && err == NULL,
        "check_options ok");
  CHECK(equarx_check_options("{\"types\": [\"s8\"]}", &err) ==
                EQUARX_INVALID_OPTIONS &&
            err && strstr(err, "\"s8\" is not one of bf16, f16, f32"),
        "check_options: %s", err ? err : "(null)");
  equarx_free_string(err);
  equarx_free_string(NULL);
  equarx_free_result(NULL);
}

/* ---- many threads at once ---------------------------------------------- */

enum { N_INPUTS = 5, N_THREADS = 8, N_ROUNDS = 2 };

typedef struct {
  buffer input;
  const char* options;
  equarx_status status;
  int changed;
  buffer output;
  char* report;
} job;

static job jobs[N_INPUTS];

static void run_job(const job* j, equarx_result* r, equarx_status* s) {
  r->struct_size = sizeof *r;
  *s = equarx_rewrite(j->input.data, j->input.len, j->options, r);
}

static int same(const job* j, const equarx_result* r, equarx_status s) {
  if (s != j->status || r->changed != j->changed) return 0;
  if (r->module_len != j->output.len) return 0;
  if (j->output.len && memcmp(r->module, j->output.data, j->output.len)) return 0;
  const char* want = j->report ? j->report : "";
  const char* got = s == EQUARX_OK ? r->report_json : r->error;
  return got && strcmp(got, want) == 0;
}

static int thread_mismatches[N_THREADS];

static void* worker(void* arg) {
  int t = (int)(intptr_t)arg;
  for (int round = 0; round < N_ROUNDS; round++) {
    for (int k = 0; k < N_INPUTS; k++) {
      const job* j = &jobs[(k + t) % N_INPUTS]; /* threads start staggered */
      equarx_result r = {sizeof r};
      equarx_status s;
      run_job(j, &r, &s);
      if (!same(j, &r, s)) thread_mismatches[t]++;
      equarx_free_result(&r);
    }
  }
  return NULL;
}

static void test_concurrent(const char* dir) {
  static const char* names[N_INPUTS] = {"psum_bf16_p8.pb", "tp_block_spmd.pb",
                                        "psum_f32_p8.pb", "scan_psum.pb", NULL};
  static const char* options[N_INPUTS] = {
      "{\"min_payload_bytes\": 0, \"pipeline_depth\": 1}",
      "{\"min_payload_bytes\": 0, \"pipeline_depth\": 2, \"bidirectional\": true}",
      "{\"min_payload_bytes\": 0, \"types\": [\"f32\"]}",
      "{\"min_payload_bytes\": 0, \"gather\": \"permute\"}", NULL};
  static const uint8_t garbage[] = {0x0a, 0xff, 0xff};
  /* Sequential results first: the reference. */
  for (int k = 0; k < N_INPUTS; k++) {
    job* j = &jobs[k];
    if (names[k]) {
      j->input = read_file(dir, names[k]);
    } else {
      j->input.data = malloc(sizeof garbage);
      memcpy(j->input.data, garbage, sizeof garbage);
      j->input.len = sizeof garbage;
    }
    j->options = options[k];
    equarx_result r = {sizeof r};
    run_job(j, &r, &j->status);
    j->changed = r.changed;
    j->output.len = r.module_len;
    j->output.data = malloc(r.module_len + 1);
    if (r.module_len) memcpy(j->output.data, r.module, r.module_len);
    const char* text = j->status == EQUARX_OK ? r.report_json : r.error;
    j->report = copy_string(text ? text : "");
    equarx_free_result(&r);
  }
  CHECK(jobs[0].changed && jobs[1].changed && jobs[2].changed && jobs[3].changed,
        "every fixture job rewrites");
  CHECK(jobs[4].status == EQUARX_INVALID_MODULE, "the garbage job fails");

  pthread_t threads[N_THREADS];
  for (int t = 0; t < N_THREADS; t++)
    pthread_create(&threads[t], NULL, worker, (void*)(intptr_t)t);
  int mismatches = 0;
  for (int t = 0; t < N_THREADS; t++) {
    pthread_join(threads[t], NULL);
    mismatches += thread_mismatches[t];
  }
  CHECK(mismatches == 0, "%d concurrent results differ from the sequential ones",
        mismatches);
  printf("%d threads x %d calls: all results identical to the sequential ones\n",
         N_THREADS, N_ROUNDS * N_INPUTS);
  for (int k = 0; k < N_INPUTS; k++) {
    free(jobs[k].input.data);
    free(jobs[k].output.data);
    free(jobs[k].report);
  }
}

/* ---- the PJRT XLA-transform extension (experimental) --------------------
 * The structs, as declared by openxla/xla's
 * xla/pjrt/c/pjrt_c_api_xla_transform_extension.h (version 1) and
 * pjrt_c_api.h. No PJRT plugin with the extension runs on this machine, so a
 * stand-in plugin below plays XLA's part: it calls the callback the way
 * XLA's adapter does. */

typedef struct {
  const char* data;
  size_t size;
} xt_string;

typedef struct {
  int64_t api_version;
  void* data;
  void (*cleanup_fn)(void* data);
  bool has_error;
  int code; /* PJRT_Error_Code */
  xt_string error_msg;
} xt_version_and_error;

struct PJRT_XlaTransform_Args {
  size_t struct_size;
  xt_version_and_error header;
  xt_string hlo_module;
  xt_string transformed_hlo_module;
  bool changed;
};

struct PJRT_XlaTransform_Callbacks {
  int64_t version;
  void (*dtor)(struct PJRT_XlaTransform_Callbacks* data);
  void (*transform_hlo_module)(struct PJRT_XlaTransform_Callbacks* data,
                               struct PJRT_XlaTransform_Args* args);
};

typedef struct ext_base {
  size_t struct_size;
  int type; /* PJRT_Extension_Type */
  struct ext_base* next;
} ext_base;

typedef struct {
  size_t struct_size;
  const char* name;
  size_t name_size;
  int stage;
  struct PJRT_XlaTransform_Callbacks* callbacks;
} register_args;

typedef struct {
  ext_base base;
  void* (*register_xla_transform)(register_args* args);
  void* (*clear_xla_transform)(void* args);
} transform_extension;

typedef struct {
  size_t struct_size;
  void* extension_start;
  const void* error;
  const char* message;
  size_t message_size;
} error_message_args;

typedef struct {
  size_t struct_size;
  void* extension_start;
  void* error;
} error_destroy_args;

typedef struct {
  size_t struct_size;
  ext_base* extension_start;
  struct {
    size_t struct_size;
    void* extension_start;
    int major, minor;
  } version;
  void (*error_destroy)(error_destroy_args*);
  void (*error_message)(error_message_args*);
} fake_api;

enum { EXT_PROFILER = 1, EXT_XLA_TRANSFORM = 24 };

#define ARGS_STRUCT_SIZE \
  (offsetof(struct PJRT_XlaTransform_Args, changed) + sizeof(bool))

static buffer pjrt_fixture;
static int pjrt_adapter_calls, pjrt_adapter_changed, errors_destroyed;
static char registered_name[128];
static int registered_stage = -1;
static const char* refuse_with = NULL;
static const char the_error[] = "the error object";

/* What XLA's CApiXlaTransformAdapter::Transform does with the callbacks. */
static void adapter_transform(struct PJRT_XlaTransform_Callbacks* callbacks,
                              const buffer* module) {
  struct PJRT_XlaTransform_Args args;
  memset(&args, 0, sizeof args);
  args.struct_size = ARGS_STRUCT_SIZE;
  args.header.api_version = 1;
  args.hlo_module.data = (const char*)module->data;
  args.hlo_module.size = module->len;
  callbacks->transform_hlo_module(callbacks, &args);
  pjrt_adapter_calls++;
  if (!args.header.has_error && args.changed &&
      args.transformed_hlo_module.size > module->len)
    pjrt_adapter_changed++;
  if (args.header.cleanup_fn) args.header.cleanup_fn(args.header.data);
}

static void* fake_register(register_args* args) {
  if (refuse_with) return (void*)the_error;
  snprintf(registered_name, sizeof registered_name, "%.*s",
           (int)args->name_size, args->name);
  registered_stage = args->stage;
  /* Older XLA copied the callbacks struct (openxla/xla#43630): use a copy,
   * as that adapter did, then the original, as the current one does. */
  struct PJRT_XlaTransform_Callbacks copy = *args->callbacks;
  adapter_transform(&copy, &pjrt_fixture);
  adapter_transform(args->callbacks, &pjrt_fixture);
  return NULL;
}

static void fake_error_message(error_message_args* a) {
  if (a->error == the_error) {
    a->message = refuse_with;
    a->message_size = strlen(refuse_with);
  }
}

static void fake_error_destroy(error_destroy_args* a) {
  if (a->error == the_error) errors_destroyed++;
}

static void test_pjrt(const char* dir) {
  pjrt_fixture = read_file(dir, "psum_bf16_p8.pb");
  char* err = NULL;

  /* 1. The callback, called directly. */
  CHECK(equarx_pjrt_configure(RING, &err) == EQUARX_OK && err == NULL,
        "configure: %s", err ? err : "");
  struct PJRT_XlaTransform_Callbacks* cb = equarx_pjrt_callbacks();
  CHECK(cb && cb->version == 1 && cb->dtor == NULL &&
            cb->transform_hlo_module == equarx_pjrt_transform_hlo_module,
        "static callbacks table");
  struct PJRT_XlaTransform_Args args;
  memset(&args, 0, sizeof args);
  args.struct_size = ARGS_STRUCT_SIZE;
  args.header.api_version = 1;
  args.hlo_module.data = (const char*)pjrt_fixture.data;
  args.hlo_module.size = pjrt_fixture.len;
  equarx_pjrt_transform_hlo_module(cb, &args);
  CHECK(!args.header.has_error && args.changed &&
            args.transformed_hlo_module.data &&
            args.transformed_hlo_module.size > pjrt_fixture.len,
        "callback rewrites: has_error=%d changed=%d msg=%.*s",
        args.header.has_error, args.changed, (int)args.header.error_msg.size,
        args.header.error_msg.data ? args.header.error_msg.data : "");
  CHECK(args.header.cleanup_fn != NULL, "callback sets cleanup_fn");
  if (args.header.cleanup_fn) args.header.cleanup_fn(args.header.data);

  /* 2. An error comes back through the header. */
  static const char bad[] = {0x0a, 0x7f};
  memset(&args, 0, sizeof args);
  args.struct_size = ARGS_STRUCT_SIZE;
  args.hlo_module.data = bad;
  args.hlo_module.size = sizeof bad;
  equarx_pjrt_transform_hlo_module(cb, &args);
  CHECK(args.header.has_error && args.header.code == 3 /* INVALID_ARGUMENT */ &&
            !args.changed && args.header.error_msg.size > 0 &&
            strncmp(args.header.error_msg.data, "equarx: ", 8) == 0,
        "callback error: has_error=%d code=%d", args.header.has_error,
        args.header.code);
  printf("PJRT callback error: %.*s\n", (int)args.header.error_msg.size,
         args.header.error_msg.data);
  if (args.header.cleanup_fn) args.header.cleanup_fn(args.header.data);

  /* 3. Registration through a plugin's extension chain. */
  ext_base profiler = {sizeof(ext_base), EXT_PROFILER, NULL};
  transform_extension xt = {{sizeof(transform_extension), EXT_XLA_TRANSFORM, NULL},
                            fake_register, NULL};
  profiler.next = &xt.base;
  fake_api api;
  memset(&api, 0, sizeof api);
  api.struct_size = sizeof api;
  api.extension_start = &profiler;
  api.error_destroy = fake_error_destroy;
  api.error_message = fake_error_message;
  CHECK(equarx_pjrt_register(&api, NULL, 0, RING, &err) == EQUARX_OK,
        "register: %s", err ? err : "");
  CHECK(strcmp(registered_name, "equarx-quantize-collectives") == 0 &&
            registered_stage == 0,
        "registered as %s at stage %d", registered_name, registered_stage);
  CHECK(pjrt_adapter_calls == 2 && pjrt_adapter_changed == 2,
        "adapter calls %d, changed %d", pjrt_adapter_calls, pjrt_adapter_changed);

  /* 4. A plugin without the extension, and one that refuses. */
  profiler.next = NULL;
  CHECK(equarx_pjrt_register(&api, "x", 0, NULL, &err) == EQUARX_INVALID_ARGUMENT &&
            err && strstr(err, "no XLA-transform extension") && strstr(err, "[1]"),
        "no extension: %s", err ? err : "(null)");
  printf("plugin without the extension: %s\n", err ? err : "");
  equarx_free_string(err);
  profiler.next = &xt.base;
  refuse_with = "stage not supported here";
  CHECK(equarx_pjrt_register(&api, "x", 1, NULL, &err) == EQUARX_INVALID_ARGUMENT &&
            err && strstr(err, "stage not supported here") && errors_destroyed == 1,
        "refused: %s (destroyed %d)", err ? err : "(null)", errors_destroyed);
  equarx_free_string(err);
  CHECK(equarx_pjrt_register(&api, "x", 7, NULL, &err) == EQUARX_INVALID_ARGUMENT,
        "bad stage");
  equarx_free_string(err);
  CHECK(equarx_pjrt_register(NULL, "x", 0, NULL, &err) == EQUARX_INVALID_ARGUMENT,
        "null api");
  equarx_free_string(err);
  free(pjrt_fixture.data);
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s FIXTURES_DIR EXPECTED_VERSION\n", argv[0]);
    return 2;
  }
  const char* dir = argv[1];
  CHECK(strcmp(equarx_version(), argv[2]) == 0, "version %s, expected %s",
        equarx_version(), argv[2]);
  test_rewrite_fixture(dir);
  test_ineligible_is_unchanged(dir);
  test_errors();
  test_concurrent(dir);
  test_pjrt(dir);
  printf("c_abi_test: %d checks, %d failures\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
