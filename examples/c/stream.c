/*
 * stream.c: generate with mica from C, streaming the text as it comes.
 *
 *   cc -std=c11 -Wall -Wextra -I include examples/c/stream.c -L target/release -lmica -o stream
 *   LD_LIBRARY_PATH=target/release ./stream MODEL "The capital of France is" [MAX_TOKENS [STOP_AFTER]]
 *
 * MODEL is a GGUF file, a .mica file or a Hugging Face folder. The prompt is tokenized as
 * `mica run -p` tokenizes it and the completion is greedy, so the text printed equals
 * `mica run -m MODEL -p PROMPT -n MAX_TOKENS --temp 0`. With STOP_AFTER, the callback asks
 * to stop after that many pieces of text. A summary goes to stderr. On failure the
 * program prints mica's message and exits with the mica_status code.
 */
#include <stdio.h>
#include <stdlib.h>

#include "mica.h"

/* What the callback keeps between calls (passed through `user`). */
typedef struct {
    size_t pieces;     /* pieces received so far */
    size_t stop_after; /* stop once this many arrived; 0: never */
} stream_state;

/* Called on this thread with each piece of final text; nonzero stops generation. */
static int on_text(const char *text, size_t len, void *user) {
    stream_state *st = user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    st->pieces++;
    return st->stop_after > 0 && st->pieces >= st->stop_after;
}

/* Prints the last error of this thread and returns the status as an exit code. */
static int fail(const char *what, mica_status status) {
    fprintf(stderr, "%s failed: status %d: %s\n", what, (int)status, mica_last_error());
    return (int)status;
}

static const char *finish_name(mica_finish_reason f) {
    switch (f) {
    case MICA_FINISH_REASON_EOS: return "eos";
    case MICA_FINISH_REASON_STOP: return "stop";
    case MICA_FINISH_REASON_LENGTH: return "length";
    case MICA_FINISH_REASON_CONTEXT: return "context";
    case MICA_FINISH_REASON_CANCELLED: return "cancelled";
    case MICA_FINISH_REASON_CONSTRAINT: return "constraint";
    }
    return "?";
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL PROMPT [MAX_TOKENS [STOP_AFTER]]\n", argv[0]);
        return 2;
    }
    if (mica_abi_version() != MICA_ABI_VERSION) {
        fprintf(stderr, "libmica has ABI %u, this program was built for %u\n",
                mica_abi_version(), MICA_ABI_VERSION);
        return 2;
    }
    size_t max_tokens = argc > 3 ? strtoul(argv[3], NULL, 10) : 64;
    stream_state st = {0, argc > 4 ? strtoul(argv[4], NULL, 10) : 0};
    fprintf(stderr, "mica %s\n", mica_version());

    /* Open the model (a path here; options->store_dir would also resolve store names). */
    mica_model *model = NULL;
    mica_status s = mica_model_open(argv[1], NULL, &model);
    if (s != MICA_STATUS_OK) return fail("mica_model_open", s);

    /* Tokenize: ask for the size, then fill a buffer of that size. */
    size_t n_prompt = 0;
    s = mica_tokenize(model, argv[2], true, true, NULL, 0, &n_prompt);
    if (s != MICA_STATUS_BUFFER_TOO_SMALL && s != MICA_STATUS_OK) {
        mica_model_free(model);
        return fail("mica_tokenize", s);
    }
    uint32_t *prompt = malloc((n_prompt ? n_prompt : 1) * sizeof *prompt);
    s = mica_tokenize(model, argv[2], true, true, prompt, n_prompt, &n_prompt);
    if (s != MICA_STATUS_OK) {
        free(prompt);
        mica_model_free(model);
        return fail("mica_tokenize", s);
    }

    /* A session runs one sequence; generate greedily, streaming through on_text. */
    mica_session *session = NULL;
    s = mica_session_new(model, NULL, &session);
    if (s != MICA_STATUS_OK) {
        free(prompt);
        mica_model_free(model);
        return fail("mica_session_new", s);
    }
    mica_generate_params params = mica_generate_params_default();
    params.temperature = 0.0f;
    params.max_tokens = max_tokens;
    mica_completion done = {0};
    s = mica_session_generate(session, prompt, n_prompt, &params, on_text, &st, &done);
    int code = 0;
    if (s != MICA_STATUS_OK) {
        code = fail("mica_session_generate", s);
    } else {
        fprintf(stderr, "\n[%zu prompt tokens, %zu generated, finish: %s, %.1f ms]\ntokens:",
                done.prompt_tokens, done.n_tokens, finish_name(done.finish),
                done.prompt_ms + done.generation_ms);
        for (size_t i = 0; i < done.n_tokens; i++) fprintf(stderr, " %u", done.tokens[i]);
        fprintf(stderr, "\n");
    }

    /* Everything mica handed out is released by its own free function. */
    mica_completion_free(&done);
    mica_session_free(session);
    mica_model_free(model);
    free(prompt);
    return code;
}
