/* Private to libsfi: the compiled-in config.json texts of the built-in model
 * presets (src/sfi_presets.c, generated from src/presets/ at build time). */
#ifndef SFI_PRESETS_H
#define SFI_PRESETS_H

typedef struct {
    const char *name; /* e.g. "Qwen3-0.6B" */
    const char *json; /* the config.json text */
} sfi_preset_src;

extern const sfi_preset_src sfi_presets[];
extern const unsigned sfi_presets_count;

#endif
