#include <cstdio>

#include "cli/commands.h"
#include "train/config.h"
#include "train/trainer.h"

namespace mx::cli {

void add_train(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("train", "train a model from a TOML config (defaults: the "
                                          "small preset on the bundled corpus)");
  auto config = std::make_shared<std::string>();
  auto sets = std::make_shared<std::vector<std::string>>();
  auto show_keys = std::make_shared<bool>(false);
  cmd->add_option("--config", *config, "TOML config file");
  cmd->add_option("--set", *sets, "override: section.key=value (repeatable)");
  cmd->add_flag("--list-keys", *show_keys, "print every config key with its meaning and exit");
  cmd->callback([&action, config, sets, show_keys] {
    action = [config, sets, show_keys] {
      if (*show_keys) {
        for (auto& line : config_reference()) std::printf("%s\n", line.c_str());
        return 0;
      }
      return run_training(load_run_config(*config, *sets));
    };
  });
}

}  // namespace mx::cli
