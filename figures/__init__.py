"""The tutorial's figures, made from committed results and logs (not imported by any training run).

    make figures                                  # = python -m figures.tutorial_images
    python -m figures.tensorboard_screenshot --logdir runs/demo --out scalars.png
"""
