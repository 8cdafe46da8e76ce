NAME = "shared-from-model-folder"
