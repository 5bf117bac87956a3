/* Where a model keeps its chat template, and the BOS/EOS texts the template is
 * rendered with: the Jinja source a model ships, found from the path an
 * operator gives (kvgate-tokenize --tokenizer, the engine's model path).
 *
 *   a GGUF file          its metadata: tokenizer.chat_template; BOS/EOS are the
 *                        pieces of tokenizer.ggml.bos_token_id / eos_token_id
 *                        in tokenizer.ggml.tokens (what llama.cpp renders with)
 *   a tokenizer.json     the files beside it, as for a directory
 *   a directory          as Hugging Face transformers loads a tokenizer:
 *                        chat_template.jinja when it exists (transformers lets
 *                        it win over tokenizer_config.json), else
 *                        tokenizer_config.json's chat_template, which is a
 *                        string or a list of {"name", "template"} (the one named
 *                        "default" is the chat template; the others are tool-use
 *                        or RAG variants a request does not select here);
 *                        BOS/EOS from tokenizer_config.json's bos_token and
 *                        eos_token (a string, or an added-token object's
 *                        "content"), the tokenizer's own idea of them
 *   anything else        (a llama2.c tokenizer.bin) carries no template: an error
 *
 * Errors name the file and what is missing or malformed. */
#ifndef KVG_CHAT_SOURCE_H
#define KVG_CHAT_SOURCE_H

#include <stddef.h>

typedef struct kvg_chat_source {
    char *template_src;          /* malloc'd, NUL-terminated; template_len excludes the NUL */
    size_t template_len;
    char *where;                 /* malloc'd: "DIR/tokenizer_config.json chat_template",
                                    "MODEL.gguf tokenizer.chat_template", ...: the name
                                    to compile the template under */
    char *tokenizer_path;        /* malloc'd: the file the vocabulary loads from (the
                                    GGUF or tokenizer.json itself, or DIR/tokenizer.json) */
    char *bos_token;             /* malloc'd, or NULL when the model's files do not say */
    char *eos_token;             /* the same */
} kvg_chat_source;

/* Finds the template for path (a GGUF, a tokenizer.json or a model directory).
 * 0 with *out filled (kvg_chat_source_free), or -1 with err and *out empty. */
int kvg_chat_source_load(const char *path, kvg_chat_source *out, char *err, size_t err_len);
void kvg_chat_source_free(kvg_chat_source *s);

#endif
