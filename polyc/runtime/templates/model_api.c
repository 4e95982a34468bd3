/* ---- the model's API (polyc/runtime/templates/model_api.c): create, run, destroy ---- */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* One instance: its own arena and weights; nothing here is shared between instances. */
struct ${prefix} {
    unsigned char *arena;    /* ${PREFIX}_ARENA_BYTES, 64-byte aligned: every tensor between kernels */
    unsigned char *weights;  /* ${PREFIX}_WEIGHTS_BYTES, 64-byte aligned: the constants of model.bin */
    int threads;             /* 0: OpenMP's default */
    int error;
    char message[512];
};

static int ${prefix}_fail(${prefix}_t *model, int error, const char *format, const char *detail)
{
    model->error = error;
    snprintf(model->message, sizeof model->message, format, detail);
    return error;
}

/* The weights file's header: 64 bytes, little-endian, then the constants. */
#define ${PREFIX}_HEADER_BYTES 64
static const char ${prefix}_magic[8] = {'P', 'O', 'L', 'Y', 'C', 'W', 'T', 'S'};

static uint64_t ${prefix}_read_u64(const unsigned char *bytes)
{
    uint64_t value = 0;
    for (int k = 7; k >= 0; k--)
        value = value << 8 | bytes[k];
    return value;
}

/* CRC-32 (zlib's): the weights' check sum (a damaged file is refused). */
static uint64_t ${prefix}_digest(const unsigned char *bytes, uint64_t count)
{
    uint32_t table[256];
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
        table[n] = c;
    }
    uint32_t crc = 0xffffffffu;
    for (uint64_t k = 0; k < count; k++)
        crc = table[(crc ^ bytes[k]) & 0xff] ^ (crc >> 8);
    return crc ^ 0xffffffffu;
}

static int ${prefix}_load_weights(${prefix}_t *model, const char *path)
{
    unsigned char header[${PREFIX}_HEADER_BYTES];
    FILE *file = fopen(path, "rb");
    if (file == NULL)
        return ${prefix}_fail(model, ${PREFIX}_ERROR_WEIGHTS, "cannot open the weights file %s", path);
    size_t got = fread(header, 1, sizeof header, file);
    if (got != sizeof header || memcmp(header, ${prefix}_magic, sizeof ${prefix}_magic) != 0) {
        fclose(file);
        return ${prefix}_fail(model, ${PREFIX}_ERROR_WEIGHTS, "%s is not a polyc weights file (no POLYCWTS header)",
                              path);
    }
    if (${prefix}_read_u64(header + 8) != ${PREFIX}_WEIGHTS_FORMAT || ${prefix}_read_u64(header + 32) != ${PREFIX}_MODEL_ID
        || ${prefix}_read_u64(header + 16) != (uint64_t)${PREFIX}_WEIGHTS_BYTES) {
        fclose(file);
        return ${prefix}_fail(model, ${PREFIX}_ERROR_WEIGHTS,
                              "%s holds the weights of another model or export (its model id, format or size "
                              "differ from this model.c's): use the model.bin exported with it", path);
    }
    if (${PREFIX}_WEIGHTS_BYTES > 0) {
        got = fread(model->weights, 1, ${PREFIX}_WEIGHTS_BYTES, file);
        if (got != (size_t)${PREFIX}_WEIGHTS_BYTES) {
            fclose(file);
            return ${prefix}_fail(model, ${PREFIX}_ERROR_WEIGHTS, "%s is truncated (fewer bytes than its header says)",
                                  path);
        }
    }
    int extra = fgetc(file);
    fclose(file);
    if (extra != EOF)
        return ${prefix}_fail(model, ${PREFIX}_ERROR_WEIGHTS, "%s has bytes after its weights: not the file exported",
                              path);
    if (${prefix}_digest(model->weights, ${PREFIX}_WEIGHTS_BYTES) != ${prefix}_read_u64(header + 24))
        return ${prefix}_fail(model, ${PREFIX}_ERROR_WEIGHTS, "%s is damaged: its check sum does not match its data",
                              path);
    return ${PREFIX}_OK;
}

static void *${prefix}_aligned(size_t bytes)
{
    return aligned_alloc(64, bytes > 0 ? (bytes + 63) / 64 * 64 : 64);
}

${prefix}_t *${prefix}_create(const char *weights_path)
{
    ${prefix}_t *model = (${prefix}_t *)calloc(1, sizeof *model);
    if (model == NULL)
        return NULL;
    const uint16_t one = 1;
    if (*(const unsigned char *)&one != 1) {
        ${prefix}_fail(model, ${PREFIX}_ERROR_WEIGHTS, "%s", "the weights are little-endian; this machine is not");
        return model;
    }
    model->arena = (unsigned char *)${prefix}_aligned(${PREFIX}_ARENA_BYTES);
    model->weights = (unsigned char *)${prefix}_aligned(${PREFIX}_WEIGHTS_BYTES);
    if (model->arena == NULL || model->weights == NULL) {
        ${prefix}_fail(model, ${PREFIX}_ERROR_MEMORY, "%s", "cannot allocate the arena and the weights");
        return model;
    }
    if (weights_path == NULL)
        weights_path = "${default_weights}";
    ${prefix}_load_weights(model, weights_path);
    return model;
}

void ${prefix}_destroy(${prefix}_t *model)
{
    if (model == NULL)
        return;
    free(model->arena);
    free(model->weights);
    free(model);
}

int ${prefix}_error(const ${prefix}_t *model)
{
    return model == NULL ? ${PREFIX}_ERROR_MEMORY : model->error;
}

const char *${prefix}_error_message(const ${prefix}_t *model)
{
    if (model == NULL)
        return "no model (it could not be allocated)";
    return model->error ? model->message : "";
}

int ${prefix}_set_threads(${prefix}_t *model, int threads)
{
    if (model == NULL || threads < 0)
        return ${PREFIX}_ERROR_ARGUMENT;
    model->threads = threads;
    return ${PREFIX}_OK;
}

const ${prefix}_tensor_t *${prefix}_input(int index)
{
    return index >= 0 && index < ${PREFIX}_NUM_INPUTS ? &${prefix}_inputs[index] : NULL;
}

const ${prefix}_tensor_t *${prefix}_output(int index)
{
    return index >= 0 && index < ${PREFIX}_NUM_OUTPUTS ? &${prefix}_outputs[index] : NULL;
}

static int ${prefix}_calls(${prefix}_t *model, const void *const *inputs, void *const *outputs);

int ${prefix}_run(${prefix}_t *model, const void *const *inputs, void *const *outputs)
{
    if (model == NULL)
        return ${PREFIX}_ERROR_ARGUMENT;
    if (model->error == ${PREFIX}_ERROR_WEIGHTS || model->error == ${PREFIX}_ERROR_MEMORY)
        return model->error;  /* create failed: the message says why */
    model->error = ${PREFIX}_OK;
    for (int k = 0; k < ${PREFIX}_NUM_INPUTS; k++)
        if (inputs == NULL || inputs[k] == NULL)
            return ${prefix}_fail(model, ${PREFIX}_ERROR_ARGUMENT, "input %s is a null pointer",
                                  ${prefix}_inputs[k].name);
    for (int k = 0; k < ${PREFIX}_NUM_OUTPUTS; k++)
        if (outputs == NULL || outputs[k] == NULL)
            return ${prefix}_fail(model, ${PREFIX}_ERROR_ARGUMENT, "output %s is a null pointer",
                                  ${prefix}_outputs[k].name);
#ifdef _OPENMP
    const int threads_before = omp_get_max_threads();
    if (model->threads > 0)
        omp_set_num_threads(model->threads);
#endif
    const int status = ${prefix}_calls(model, inputs, outputs);
#ifdef _OPENMP
    if (model->threads > 0)
        omp_set_num_threads(threads_before);
#endif
    return status;
}

/* A kernel's nonzero status as the model's error. */
static int ${prefix}_kernel_failed(${prefix}_t *model, int status, const char *call)
{
    model->error = ${PREFIX}_ERROR_KERNEL;
    snprintf(model->message, sizeof model->message, "%s: %s", call,
             status == ${out_of_memory} ? "the kernel could not allocate its working memory"
                         : "a data-dependent subscript fell outside its tensor (an index input holds a value out "
                           "of range)");
    return ${PREFIX}_ERROR_KERNEL;
}
